//! Showing download progress: an `indicatif` bar on a terminal, plain lines (start, every 10 %,
//! end) for a log file or a pipe, the same lines as `tracing` events under `serve`, or nothing.
//!
//! indicatif owns the bar: redrawing it in place at most 20 times a second, fitting it to the
//! terminal's width (a line that wraps cannot be redrawn), the rate, the time left, the byte units.
//! The lines are ours because indicatif has no such mode: it draws nothing where stderr is not a
//! terminal, and a log wants a handful of lines per file, not a frame per redraw.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use indicatif::{BinaryBytes, ProgressBar, ProgressDrawTarget};

use crate::options::ProgressStyle;

/// Files smaller than this get only their final line in line mode.
const SMALL_FILE: u64 = 1 << 20;
/// Line mode reports every this many bytes when the size is unknown.
const UNKNOWN_SIZE_STEP: u64 = 64 << 20;
/// The bar of a file of known size. `wide_msg` (the file's path) takes what the terminal's width
/// leaves; right-aligned, it loses its start when cut, so the file name stays.
const BAR_TEMPLATE: &str =
    "{wide_msg:>} [{bar:12}] {percent:>3}% {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}";
/// The same without a size: no bar, no percentage, no time left.
const SIZELESS_TEMPLATE: &str = "{wide_msg:>} {binary_bytes} {binary_bytes_per_sec}";

/// Where progress goes, with the style already decided.
pub(crate) struct Progress {
    style: Resolved,
    /// Notes, and the lines of [`Resolved::Lines`].
    out: Box<dyn Write + Send>,
    /// Where a bar draws: stderr, or a test's stand-in terminal.
    bar_target: Box<dyn Fn() -> ProgressDrawTarget + Send>,
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
        Self::to_writer(
            style,
            terminal,
            Box::new(std::io::stderr()),
            Box::new(ProgressDrawTarget::stderr),
        )
    }

    /// Progress written to `out` (and bars drawn on `bar_target`), which is a terminal when
    /// `terminal` says so.
    fn to_writer(
        style: ProgressStyle,
        terminal: bool,
        out: Box<dyn Write + Send>,
        bar_target: Box<dyn Fn() -> ProgressDrawTarget + Send>,
    ) -> Self {
        let style = match style {
            ProgressStyle::Auto if terminal => Resolved::Bar,
            ProgressStyle::Auto | ProgressStyle::Lines => Resolved::Lines,
            ProgressStyle::Bar => Resolved::Bar,
            ProgressStyle::Log => Resolved::Log,
            ProgressStyle::Silent => Resolved::Silent,
        };
        Self { style, out, bar_target }
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
        let bar = (self.style == Resolved::Bar).then(|| {
            let template = if total.is_some() {
                BAR_TEMPLATE
            } else {
                SIZELESS_TEMPLATE
            };
            // Both templates are constants that parse; the default style would do if one did not.
            let style = indicatif::ProgressStyle::with_template(template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
            let bar = ProgressBar::with_draw_target(total, (self.bar_target)())
                .with_style(style)
                .with_message(name.to_owned());
            bar.set_position(done);
            // The rate and the time left count from here, not from the bytes a resume kept.
            bar.reset_eta();
            bar
        });
        let mut file = FileProgress {
            progress: self,
            name: name.to_owned(),
            total,
            started_at: done,
            start: Instant::now(),
            next_mark: 0,
            bar,
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
    /// Line mode: the next byte count that earns a line.
    next_mark: u64,
    /// Bar mode: the bar.
    bar: Option<ProgressBar>,
}

impl FileProgress<'_> {
    /// `done` bytes of the file are now on disk.
    pub(crate) fn advance(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        if !matches!(self.progress.style, Resolved::Lines | Resolved::Log) {
            return;
        }
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

    /// The download ended with `done` bytes on disk.
    pub(crate) fn finish(self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.finish();
            return;
        }
        let seconds = self.start.elapsed().as_secs_f64();
        let summary = format!(
            "{}: {} in {seconds:.1} s ({}/s)",
            self.name,
            human(done),
            human(self.rate(done))
        );
        self.progress.note(&summary);
    }

    /// Leaves the bar where it stopped (a failed download); its line stays on screen.
    pub(crate) fn interrupt(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }

    /// A note while this file is in progress, printed above the bar, which is then redrawn.
    pub(crate) fn note(&mut self, text: &str) {
        match self.bar.clone() {
            Some(bar) => bar.suspend(|| self.progress.note(text)),
            None => self.progress.note(text),
        }
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

/// Whole percent of `done` in `total`, 0..=100.
fn percent(done: u64, total: u64) -> u64 {
    if total == 0 {
        100
    } else {
        (u128::from(done.min(total)) * 100 / u128::from(total)) as u64
    }
}

/// Bytes in binary units as the bar shows them (indicatif's): `512 B`, `1.50 KiB`, `2.10 GiB`.
pub(crate) fn human(bytes: u64) -> String {
    BinaryBytes(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use indicatif::TermLike;

    use super::*;

    /// A writer, and a terminal for indicatif to draw on, that the test can read back.
    #[derive(Clone, Debug, Default)]
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

    /// An 80-column terminal that records each frame drawn on a line of its own (indicatif
    /// clears the line before each frame).
    impl TermLike for Captured {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.clone().write_all(format!("{s}\n").as_bytes())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.clone().write_all(s.as_bytes())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.clone().write_all(b"\n")
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("lock").clone()).expect("utf-8")
        }
    }

    /// Progress whose notes go to `out` and whose bars draw on `term`.
    fn progress(style: ProgressStyle, terminal: bool, out: &Captured, term: &Captured) -> Progress {
        let term = term.clone();
        Progress::to_writer(
            style,
            terminal,
            Box::new(out.clone()),
            Box::new(move || ProgressDrawTarget::term_like(Box::new(term.clone()))),
        )
    }

    /// Reports a file of `total` bytes through `steps`; returns what went to the writer and to the terminal.
    fn run(style: ProgressStyle, terminal: bool, total: u64, steps: &[u64]) -> (String, String) {
        let (out, term) = (Captured::default(), Captured::default());
        let mut progress = progress(style, terminal, &out, &term);
        let mut file = progress.file("model.safetensors", Some(total), 0);
        for &done in steps {
            file.advance(done);
        }
        file.finish(total);
        (out.text(), term.text())
    }

    #[test]
    fn human_sizes_use_binary_units() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(2198508), "2.10 MiB");
        assert_eq!(human(3 << 30), "3.00 GiB");
    }

    #[test]
    fn lines_come_every_ten_percent_then_a_summary() {
        let total = 100 << 20;
        let steps: Vec<u64> = (1..=100).map(|i| i * (1 << 20)).collect();
        let (text, term) = run(ProgressStyle::Lines, false, total, &steps);
        assert_eq!(term, "", "no bar outside a terminal");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "model.safetensors: downloading 100.00 MiB");
        let percents: Vec<&str> = lines[1..lines.len() - 1]
            .iter()
            .map(|l| l.split_whitespace().nth(1).expect("percent"))
            .collect();
        assert_eq!(
            percents,
            ["10%", "20%", "30%", "40%", "50%", "60%", "70%", "80%", "90%"]
        );
        let last = lines.last().expect("summary");
        assert!(last.starts_with("model.safetensors: 100.00 MiB in "), "{last}");
        assert!(!text.contains('\r'));
    }

    #[test]
    fn small_files_get_only_the_summary_line() {
        let (text, _) = run(ProgressStyle::Lines, false, 509, &[200, 509]);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.starts_with("model.safetensors: 509 B in "), "{text}");
    }

    #[test]
    fn auto_draws_an_indicatif_bar_on_a_terminal_and_lines_elsewhere() {
        let (lines, term) = run(ProgressStyle::Auto, true, 4 << 20, &[1 << 20, 2 << 20]);
        assert_eq!(lines, "", "a bar, not lines");
        let last = term.lines().last().expect("the finished bar");
        assert!(last.trim_start().starts_with("model.safetensors ["), "{term:?}");
        assert!(last.contains("[============] 100% 4.00 MiB/4.00 MiB "), "{term:?}");
        assert_eq!(last.chars().count(), 80, "the path is padded to the width: {last:?}");
        let (lines, term) = run(ProgressStyle::Auto, false, 4 << 20, &[1 << 20, 2 << 20]);
        assert_eq!(term, "");
        assert!(
            lines.starts_with("model.safetensors: downloading 4.00 MiB\n"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_long_path_is_cut_to_the_terminal_width() {
        let (out, term) = (Captured::default(), Captured::default());
        let mut progress = progress(ProgressStyle::Bar, true, &out, &term);
        let name = "multilingual/tokenizer/tokenizer_config.json";
        progress.file(name, Some(900 << 20), 0).finish(900 << 20);
        let text = term.text();
        let last = text.lines().last().expect("frame");
        assert_eq!(last.chars().count(), 80, "{last:?}");
        // How much of the path fits depends on the rate's width; its end is what stays.
        let shown = last.split(" [").next().expect("path");
        assert!(
            shown.len() < name.len() && name.ends_with(shown),
            "the start goes: {last:?}"
        );
        assert!(
            shown.ends_with("/tokenizer_config.json"),
            "the file name stays: {last:?}"
        );
        assert!(last.contains("100% 900.00 MiB/900.00 MiB"), "{last:?}");
    }

    #[test]
    fn a_note_during_a_bar_is_written_and_the_bar_goes_on() {
        let (out, term) = (Captured::default(), Captured::default());
        let mut progress = progress(ProgressStyle::Bar, true, &out, &term);
        let mut file = progress.file("model.safetensors", Some(10 << 20), 0);
        file.advance(3 << 20);
        file.note("model.safetensors: interrupted; resuming");
        file.advance(10 << 20);
        file.finish(10 << 20);
        assert_eq!(out.text(), "model.safetensors: interrupted; resuming\n");
        assert!(term.text().contains("100% 10.00 MiB/10.00 MiB"), "{:?}", term.text());
    }

    #[test]
    fn a_resume_says_where_it_starts() {
        let (out, term) = (Captured::default(), Captured::default());
        let mut progress = progress(ProgressStyle::Lines, false, &out, &term);
        let file = progress.file("model.safetensors", Some(10 << 20), 3 << 20);
        file.finish(10 << 20);
        assert!(
            out.text()
                .starts_with("model.safetensors: resuming at 3.00 MiB of 10.00 MiB\n"),
            "{}",
            out.text()
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
        let (direct, term) = (Captured::default(), Captured::default());
        tracing::subscriber::with_default(subscriber, || {
            let mut progress = progress(ProgressStyle::Log, false, &direct, &term);
            progress.note("fetching english");
            progress.file("model.safetensors", Some(2 << 20), 0).finish(2 << 20);
        });
        assert_eq!(direct.text(), "", "nothing bypasses the log");
        assert_eq!(term.text(), "");
        let text = log.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("INFO layad_hub: fetching english"), "{text}");
        assert!(lines[1].ends_with("model.safetensors: downloading 2.00 MiB"), "{text}");
        assert!(lines[2].contains("model.safetensors: 2.00 MiB in "), "{text}");
    }

    #[test]
    fn silent_writes_nothing() {
        assert_eq!(
            run(ProgressStyle::Silent, true, 4 << 20, &[1 << 20]),
            (String::new(), String::new())
        );
    }
}
