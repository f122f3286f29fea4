//! A Python engine as a child process that times forwards on request, so the bench can run it beside
//! candle's on the same checkpoint: upstream PyTorch (`tools/bench/torch_forward.py serve`) or ONNX
//! Runtime (`tools/bench/onnx_forward.py serve`), which speak the same JSON-lines protocol.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

/// A running upstream process with one checkpoint loaded.
pub(crate) struct UpstreamSession {
    child: Child,
    /// Dropping it (end of input) ends the serve loop.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// What runs the forwards: `torch.__version__`, or the ONNX Runtime version and precision.
    pub(crate) torch: String,
    /// The engine's compute threads (`torch.get_num_threads()`).
    pub(crate) threads: u64,
}

/// Upstream's answer to one request.
pub(crate) struct UpstreamReply {
    /// Wall time of each forward, ms.
    pub(crate) times_ms: Vec<f64>,
    /// Per row, the marker logits (when outputs were asked for).
    pub(crate) logits: Vec<Vec<f32>>,
    /// Per row, softmax of the act logits (when outputs were asked for).
    pub(crate) act_probabilities: Vec<Vec<f32>>,
}

fn floats(value: &Value) -> Vec<Vec<f32>> {
    let rows = value.as_array().map(Vec::as_slice).unwrap_or_default();
    rows.iter()
        .map(|row| {
            let xs = row.as_array().map(Vec::as_slice).unwrap_or_default();
            xs.iter().filter_map(Value::as_f64).map(|x| x as f32).collect()
        })
        .collect()
}

impl UpstreamSession {
    /// Starts `python script serve --checkpoint ... --threads ... extra...` and waits until the model
    /// is loaded.
    pub(crate) fn start(
        python: &str,
        script: &Path,
        checkpoint: &Path,
        threads: usize,
        extra: &[&std::ffi::OsStr],
    ) -> Result<Self, String> {
        let mut child = Command::new(python)
            .arg(script)
            .arg("serve")
            .arg("--checkpoint")
            .arg(checkpoint)
            .args(["--threads", &threads.to_string()])
            .args(extra)
            .env("HF_HUB_OFFLINE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin for the upstream process")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout for the upstream process")?);
        let mut session = Self {
            child,
            stdin: Some(stdin),
            stdout,
            torch: String::new(),
            threads: 0,
        };
        let ready = session.read_line()?;
        if ready["ready"] != true {
            return Err(format!("upstream did not start: {ready}"));
        }
        // torch_forward.py names its torch, onnx_forward.py its runtime.
        session.torch = ready["torch"]
            .as_str()
            .or_else(|| ready["runtime"].as_str())
            .unwrap_or("?")
            .to_owned();
        session.threads = ready["threads"].as_u64().unwrap_or(0);
        Ok(session)
    }

    fn read_line(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| format!("reading from upstream: {e}"))?;
        if n == 0 {
            return Err("upstream exited".to_owned());
        }
        serde_json::from_str(&line).map_err(|e| format!("upstream printed something other than JSON: {e}"))
    }

    /// Times `runs` forwards of `rows` rows of `length` tokens; with `outputs`, returns the last
    /// forward's logits and act probabilities too.
    pub(crate) fn forward(
        &mut self,
        length: usize,
        rows: usize,
        runs: usize,
        outputs: bool,
    ) -> Result<UpstreamReply, String> {
        let request = json!({"length": length, "rows": rows, "runs": runs, "outputs": outputs});
        let stdin = self.stdin.as_mut().ok_or("upstream input already closed")?;
        writeln!(stdin, "{request}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("writing to upstream: {e}"))?;
        let reply = self.read_line()?;
        let times = reply["times_ms"].as_array().map(Vec::as_slice).unwrap_or_default();
        Ok(UpstreamReply {
            times_ms: times.iter().filter_map(Value::as_f64).collect(),
            logits: floats(&reply["logits"]),
            act_probabilities: floats(&reply["act_probabilities"]),
        })
    }
}

impl Drop for UpstreamSession {
    fn drop(&mut self) {
        // End of input ends the serve loop; wait so no process outlives the bench.
        self.stdin.take();
        let _ = self.child.wait();
    }
}
