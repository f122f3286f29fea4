//! Showing download progress: a bar redrawn in place on a terminal, plain lines (every 10 %) for a
//! log file or a pipe, the same lines as `tracing` events under `serve`, or nothing.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::options::ProgressStyle;

/// A bar is redrawn at most this often.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// Files smaller than this get only their final line in line mode.
const SMALL_FILE: u64 = 1 << 20;
/// Line mode reports every this many bytes when the size is unknown.
const UNKNOWN_SIZE_STEP: u64 = 64 << 20;
/// Width of the bar itself, in characters.
const BAR_WIDTH: usize = 12;
/// Longest file name on a bar line; with the bar and numbers the line stays within 80 columns,
/// because a line that wraps cannot be redrawn in place.
const BAR_NAME: usize = 20;

/// Where progress goes, with the style already decided.
pub(crate) struct Progress {
    style: Resolved,
    out: Box<dyn Write + Send>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resolved {
    Bar,
    Lines,
    Log,
    Silent,
}

impl Progress {
    /// Progress on stderr; `Auto` draws a bar only when stderr is a terminal.
    pub(crate) fn stderr(style: ProgressStyle) -> Self {
        let terminal = std::io::stderr().is_terminal();
        Self::to_writer(style, terminal, Box::new(std::io::stderr()))
    }

    /// Progress written to `out`, which is a terminal when `terminal` says so.
    fn to_writer(style: ProgressStyle, terminal: bool, out: Box<dyn Write + Send>) -> Self {
        let style = match style {
            ProgressStyle::Auto if terminal => Resolved::Bar,
            ProgressStyle::Auto | ProgressStyle::Lines => Resolved::Lines,
            ProgressStyle::Bar => Resolved::Bar,
            ProgressStyle::Log => Resolved::Log,
            ProgressStyle::Silent => Resolved::Silent,
        };
        Self { style, out }
    }

    /// A whole line of news (what is being fetched, a retry, a warning).
    pub(crate) fn note(&mut self, text: &str) {
        match self.style {
            Resolved::Bar | Resolved::Lines => {
                // Progress output must never fail a download; a closed stderr just loses the line.
                let _ = writeln!(self.out, "{text}");
            }
            Resolved::Log => tracing::info!(target: "layad_hub", "{text}"),
            Resolved::Silent => {}
        }
    }

    /// Starts reporting one file of `total` bytes (when known), of which `done` are already here.
    pub(crate) fn file(&mut self, name: &str, total: Option<u64>, done: u64) -> FileProgress<'_> {
        let mut file = FileProgress {
            progress: self,
            name: name.to_owned(),
            total,
            started_at: done,
            start: Instant::now(),
            last_draw: None,
            drawn_width: 0,
            next_mark: 0,
        };
        file.next_mark = file.mark_after(done);
        let big = total.is_none_or(|t| t >= SMALL_FILE);
        if big && matches!(file.progress.style, Resolved::Lines | Resolved::Log) {
            let line = match (done, total) {
                (0, Some(total)) => format!("{name}: downloading {}", human(total)),
                (0, None) => format!("{name}: downloading (size unknown)"),
                (done, Some(total)) => format!("{name}: resuming at {} of {}", human(done), human(total)),
                (done, None) => format!("{name}: resuming at {}", human(done)),
            };
            file.progress.note(&line);
        }
        file
    }
}

/// Progress of one file's download.
pub(crate) struct FileProgress<'a> {
    progress: &'a mut Progress,
    name: String,
    total: Option<u64>,
    /// Bytes already present when this download started (a resume), excluded from the rate.
    started_at: u64,
    start: Instant,
    last_draw: Option<Instant>,
    /// Bar mode: characters of the line drawn last, to blank what a shorter redraw leaves behind.
    drawn_width: usize,
    /// Line mode: the next byte count that earns a line.
    next_mark: u64,
}

impl FileProgress<'_> {
    /// `done` bytes of the file are now on disk.
    pub(crate) fn advance(&mut self, done: u64) {
        match self.progress.style {
            Resolved::Bar => {
                if self.last_draw.is_none_or(|t| t.elapsed() >= REDRAW_EVERY) {
                    self.last_draw = Some(Instant::now());
                    self.draw(done, "");
                }
            }
            Resolved::Lines | Resolved::Log => {
                if done >= self.next_mark && self.total.is_none_or(|t| t >= SMALL_FILE && done < t) {
                    self.next_mark = self.mark_after(done);
                    let line = match self.total {
                        Some(total) => format!(
                            "{}: {}% ({} of {}, {}/s)",
                            self.name,
                            percent(done, total),
                            human(done),
                            human(total),
                            human(self.rate(done))
                        ),
                        None => format!("{}: {} ({}/s)", self.name, human(done), human(self.rate(done))),
                    };
                    self.progress.note(&line);
                }
            }
            Resolved::Silent => {}
        }
    }

    /// The download ended with `done` bytes on disk.
    pub(crate) fn finish(mut self, done: u64) {
        let seconds = self.start.elapsed().as_secs_f64();
        let summary = format!(
            "{}: {} in {seconds:.1} s ({}/s)",
            self.name,
            human(done),
            human(self.rate(done))
        );
        match self.progress.style {
            Resolved::Bar => self.draw(done, "\n"),
            Resolved::Lines | Resolved::Log => self.progress.note(&summary),
            Resolved::Silent => {}
        }
        self.last_draw = None;
    }

    /// Redraws the bar line in place, then writes `end`.
    fn draw(&mut self, done: u64, end: &str) {
        let line = bar_line(&self.name, done, self.total, self.rate(done));
        let width = line.chars().count();
        let blank = " ".repeat(self.drawn_width.saturating_sub(width));
        self.drawn_width = if end.is_empty() { width } else { 0 };
        let _ = write!(self.progress.out, "\r{line}{blank}{end}");
        let _ = self.progress.out.flush();
    }

    /// Ends the current line of a bar (before a note about a retry, say).
    pub(crate) fn interrupt(&mut self) {
        if self.progress.style == Resolved::Bar && self.last_draw.is_some() {
            let _ = writeln!(self.progress.out);
            self.last_draw = None;
            self.drawn_width = 0;
        }
    }

    /// A note while this file is in progress.
    pub(crate) fn note(&mut self, text: &str) {
        self.interrupt();
        self.progress.note(text);
    }

    /// Bytes per second since this download started.
    fn rate(&self, done: u64) -> u64 {
        let seconds = self.start.elapsed().as_secs_f64();
        if seconds <= 0.0 {
            return 0;
        }
        (done.saturating_sub(self.started_at) as f64 / seconds) as u64
    }

    /// Line mode: the first byte count above `done` that earns a line (next 10 %, or next 64 MiB).
    fn mark_after(&self, done: u64) -> u64 {
        match self.total {
            Some(total) if total > 0 => {
                let next_tenth = done.saturating_mul(10) / total + 1;
                next_tenth.saturating_mul(total).div_ceil(10)
            }
            _ => (done / UNKNOWN_SIZE_STEP + 1) * UNKNOWN_SIZE_STEP,
        }
    }
}

/// `name [=====>     ]  45% 1.2 MiB/2.6 MiB 3.1 MiB/s`
fn bar_line(name: &str, done: u64, total: Option<u64>, rate: u64) -> String {
    let name = short_name(name);
    match total {
        Some(total) if total > 0 => {
            let filled = (done.min(total) as f64 / total as f64 * BAR_WIDTH as f64) as usize;
            let head = if filled < BAR_WIDTH { ">" } else { "" };
            let bar = format!("{}{head}", "=".repeat(filled));
            format!(
                "{name} [{bar:<BAR_WIDTH$}] {:>3}% {}/{} {}/s",
                percent(done, total),
                human(done),
                human(total),
                human(rate)
            )
        }
        _ => format!("{name} {} {}/s", human(done), human(rate)),
    }
}

/// `name`, or its last characters after `…` when longer than [`BAR_NAME`].
fn short_name(name: &str) -> String {
    let count = name.chars().count();
    if count <= BAR_NAME {
        return name.to_owned();
    }
    let tail: String = name.chars().skip(count - (BAR_NAME - 1)).collect();
    format!("…{tail}")
}

/// Whole percent of `done` in `total`, 0..=100.
fn percent(done: u64, total: u64) -> u64 {
    if total == 0 {
        100
    } else {
        (u128::from(done.min(total)) * 100 / u128::from(total)) as u64
    }
}

/// Bytes in binary units with one decimal: `512 B`, `1.5 KiB`, `2.1 GiB`.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("lock").clone()).expect("utf-8")
        }
    }

    fn run(style: ProgressStyle, terminal: bool, total: u64, steps: &[u64]) -> String {
        let out = Captured::default();
        let mut progress = Progress::to_writer(style, terminal, Box::new(out.clone()));
        let mut file = progress.file("model.safetensors", Some(total), 0);
        for &done in steps {
            file.advance(done);
        }
        file.finish(total);
        out.text()
    }

    #[test]
    fn human_sizes_use_binary_units() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(2198508), "2.1 MiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }

    #[test]
    fn lines_come_every_ten_percent_then_a_summary() {
        let total = 100 << 20;
        let steps: Vec<u64> = (1..=100).map(|i| i * (1 << 20)).collect();
        let text = run(ProgressStyle::Lines, false, total, &steps);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "model.safetensors: downloading 100.0 MiB");
        let percents: Vec<&str> = lines[1..lines.len() - 1]
            .iter()
            .map(|l| l.split_whitespace().nth(1).expect("percent"))
            .collect();
        assert_eq!(
            percents,
            ["10%", "20%", "30%", "40%", "50%", "60%", "70%", "80%", "90%"]
        );
        let last = lines.last().expect("summary");
        assert!(last.starts_with("model.safetensors: 100.0 MiB in "), "{last}");
        assert!(!text.contains('\r'));
    }

    #[test]
    fn small_files_get_only_the_summary_line() {
        let text = run(ProgressStyle::Lines, false, 509, &[200, 509]);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.starts_with("model.safetensors: 509 B in "), "{text}");
    }

    #[test]
    fn auto_draws_a_bar_on_a_terminal_and_lines_elsewhere() {
        let bar = run(ProgressStyle::Auto, true, 4 << 20, &[1 << 20, 2 << 20]);
        assert!(bar.starts_with("\rmodel.safetensors ["), "{bar:?}");
        assert!(bar.ends_with('\n'));
        assert!(bar.contains("] 100% 4.0 MiB/4.0 MiB "), "{bar:?}");
        let lines = run(ProgressStyle::Auto, false, 4 << 20, &[1 << 20, 2 << 20]);
        assert!(!lines.contains('\r'));
        assert!(
            lines.starts_with("model.safetensors: downloading 4.0 MiB\n"),
            "{lines:?}"
        );
    }

    #[test]
    fn bar_fills_in_proportion() {
        let half = bar_line("f", 50, Some(100), 0);
        assert_eq!(
            half,
            format!("f [{:<12}]  50% 50 B/100 B 0 B/s", format!("{}>", "=".repeat(6)))
        );
        let full = bar_line("f", 100, Some(100), 0);
        assert!(full.contains(&format!("[{}]", "=".repeat(12))), "{full}");
    }

    #[test]
    fn bar_lines_fit_80_columns() {
        let worst = bar_line(
            "multilingual/tokenizer/tokenizer_config.json",
            1023 << 20,
            Some(1023 << 30),
            1023 << 20,
        );
        assert!(worst.starts_with("…kenizer_config.json ["), "{worst}");
        assert!(
            worst.chars().count() <= 80,
            "{} columns: {worst}",
            worst.chars().count()
        );
    }

    #[test]
    fn a_shorter_redraw_blanks_the_rest_of_the_line() {
        let out = Captured::default();
        let mut progress = Progress::to_writer(ProgressStyle::Bar, true, Box::new(out.clone()));
        let mut file = progress.file("f", None, 0);
        file.drawn_width = 40;
        file.draw(1, "");
        let text = out.text();
        let line = text.trim_start_matches('\r');
        assert_eq!(line.chars().count(), 40, "{text:?}");
        assert!(line.ends_with(' '));
    }

    #[test]
    fn a_resume_says_where_it_starts() {
        let out = Captured::default();
        let mut progress = Progress::to_writer(ProgressStyle::Lines, false, Box::new(out.clone()));
        let file = progress.file("model.safetensors", Some(10 << 20), 3 << 20);
        file.finish(10 << 20);
        assert!(
            out.text()
                .starts_with("model.safetensors: resuming at 3.0 MiB of 10.0 MiB\n")
        );
    }

    #[test]
    fn log_style_emits_the_lines_as_tracing_events() {
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let direct = Captured::default();
        tracing::subscriber::with_default(subscriber, || {
            let mut progress = Progress::to_writer(ProgressStyle::Log, false, Box::new(direct.clone()));
            progress.note("fetching english");
            progress.file("model.safetensors", Some(2 << 20), 0).finish(2 << 20);
        });
        assert_eq!(direct.text(), "", "nothing bypasses the log");
        let text = log.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("INFO layad_hub: fetching english"), "{text}");
        assert!(lines[1].ends_with("model.safetensors: downloading 2.0 MiB"), "{text}");
        assert!(lines[2].contains("model.safetensors: 2.0 MiB in "), "{text}");
    }

    #[test]
    fn silent_writes_nothing() {
        assert_eq!(run(ProgressStyle::Silent, true, 4 << 20, &[1 << 20]), "");
    }
}
