//! The two configuration files of a checkpoint, as typed structs: `rl_agent_config.json` (decision
//! limits, temperatures, act costs) and `encoder/config.json` (the ModernBERT shape the engine builds).
//!
//! Both are parsed by hand from JSON so that every problem names the file and the key, and so that
//! both transformers-4 and transformers-5 spellings of the encoder config are understood.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::CheckpointError;
use crate::python_text::{number_as_f64, number_is_int, py_repr};

/// Lowest temperature upstream applies (`TEMP_MIN`); smaller configured values are raised to it.
pub const TEMP_MIN: f64 = 0.5;
/// Highest temperature upstream applies (`TEMP_MAX`); larger configured values are lowered to it.
pub const TEMP_MAX: f64 = 5.0;

/// Mixed-precision dtype the checkpoint asks for on GPUs (`amp_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmpDtype {
    /// `"bf16"`.
    Bf16,
    /// Anything else (upstream's fallback).
    F16,
}

/// A configured temperature that upstream will not use as written.
#[derive(Clone, Debug, PartialEq)]
pub struct ClampedTemperature {
    /// Where it came from: a bucket key such as `choice:11+`, or `temperature[1]`.
    pub entry: String,
    /// The configured value, as Python's `repr` shows it.
    pub raw: String,
    /// The value that is applied instead.
    pub applied: f64,
}

/// Calibration temperatures with upstream's clamp already applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Temperatures {
    /// Per question type (choice, score, noul), used when no bucket entry matches.
    pub by_type: [f64; 3],
    /// Per `"<type>:<size>"` bucket, in file order.
    pub by_options: Vec<(String, f64)>,
    /// Entries that were clamped or unreadable, for the load-time warning.
    pub clamped: Vec<ClampedTemperature>,
}

/// Python's `float(x)` on a JSON value, or `None` where Python raises.
fn python_float(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => Some(number_as_f64(n)),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
}

/// Upstream's `clamp_temperature`: into [0.5, 5.0], and 1.0 for anything that is not a finite number.
pub fn clamp_temperature(value: &Value) -> f64 {
    match python_float(value) {
        Some(t) if t.is_finite() => t.clamp(TEMP_MIN, TEMP_MAX),
        _ => 1.0,
    }
}

/// The decision settings of a checkpoint (`rl_agent_config.json`).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// Hugging Face id of the base encoder (only used upstream when `encoder/` is missing).
    pub encoder: String,
    /// Number of transformer layers in the decision head.
    pub head_layers: usize,
    /// Act costs in file order; upstream's `n_act` is their count plus one.
    pub act_costs: Vec<(String, f64)>,
    /// Longest row in tokens (default 512).
    pub max_len: usize,
    /// Token budget for the question head and its options (default 192).
    pub head_max_len: usize,
    /// Mixed-precision dtype for GPUs.
    pub amp_dtype: AmpDtype,
    /// Calibration temperatures, clamped as upstream applies them.
    pub temperatures: Temperatures,
}

fn invalid(path: &Path, problem: impl Into<String>) -> CheckpointError {
    CheckpointError::Invalid {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

fn positive_int(path: &Path, map: &Map<String, Value>, key: &str, default: usize) -> Result<usize, CheckpointError> {
    match map.get(key) {
        None => Ok(default),
        Some(Value::Number(n)) if number_is_int(n) => match n.as_u64() {
            Some(v) if v > 0 => usize::try_from(v).map_err(|_| invalid(path, format!("'{key}' is too large: {n}"))),
            _ => Err(invalid(path, format!("'{key}' must be a positive integer, got {n}"))),
        },
        Some(other) => Err(invalid(
            path,
            format!("'{key}' must be a positive integer, got {}", py_repr(other)),
        )),
    }
}

impl AgentConfig {
    /// Reads and checks `rl_agent_config.json`.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let value = read_json(path)?;
        Self::from_json(path, &value)
    }

    /// Builds the config from parsed JSON; `path` is only used in error messages.
    pub fn from_json(path: &Path, value: &Value) -> Result<Self, CheckpointError> {
        let map = value
            .as_object()
            .ok_or_else(|| invalid(path, "must hold a JSON object"))?;
        let missing: Vec<&str> = ["encoder", "head_layers"]
            .into_iter()
            .filter(|k| !map.contains_key(*k))
            .collect();
        if !missing.is_empty() {
            return Err(invalid(
                path,
                format!("missing configuration keys {missing:?}; is this a Laya decision checkpoint?"),
            ));
        }
        let encoder = match &map["encoder"] {
            Value::String(s) => s.clone(),
            other => py_repr(other),
        };
        let head_layers = match &map["head_layers"] {
            Value::Number(n) if number_is_int(n) => n
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| invalid(path, format!("'head_layers' must be a non-negative integer, got {n}")))?,
            other => {
                return Err(invalid(
                    path,
                    format!("'head_layers' must be a non-negative integer, got {}", py_repr(other)),
                ));
            }
        };
        let act_costs = match map.get("act_costs") {
            None => Vec::new(),
            Some(Value::Object(costs)) => costs
                .iter()
                .map(|(k, v)| match python_float(v) {
                    Some(cost) => Ok((k.clone(), cost)),
                    None => Err(invalid(
                        path,
                        format!("'act_costs'.'{k}' must be a number, got {}", py_repr(v)),
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(invalid(
                    path,
                    format!("'act_costs' must be an object, got {}", py_repr(other)),
                ));
            }
        };
        let max_len = positive_int(path, map, "max_len", 512)?;
        let head_max_len = positive_int(path, map, "head_max_len", 192)?;
        let amp_dtype = match map.get("amp_dtype") {
            Some(Value::String(s)) if s == "bf16" => AmpDtype::Bf16,
            _ => AmpDtype::F16,
        };
        let temperatures = Self::temperatures(path, map)?;
        Ok(Self {
            encoder,
            head_layers,
            act_costs,
            max_len,
            head_max_len,
            amp_dtype,
            temperatures,
        })
    }

    fn temperatures(path: &Path, map: &Map<String, Value>) -> Result<Temperatures, CheckpointError> {
        let one = Value::from(1.0);
        let raw_by_type: Vec<Value> = match map.get("temperature") {
            None => vec![one.clone(), one.clone(), one],
            Some(Value::Array(items)) if items.len() == 3 => items.clone(),
            Some(other) => {
                return Err(invalid(
                    path,
                    format!(
                        "'temperature' must be a list of 3 numbers (choice, score, noul), got {}",
                        py_repr(other)
                    ),
                ));
            }
        };
        let raw_by_options: Vec<(String, Value)> = match map.get("temperature_by_options") {
            None => Vec::new(),
            Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Some(other) => {
                return Err(invalid(
                    path,
                    format!(
                        "'temperature_by_options' must be an object of bucket -> number, got {}",
                        py_repr(other)
                    ),
                ));
            }
        };
        let by_type = [
            clamp_temperature(&raw_by_type[0]),
            clamp_temperature(&raw_by_type[1]),
            clamp_temperature(&raw_by_type[2]),
        ];
        let by_options: Vec<(String, f64)> = raw_by_options
            .iter()
            .map(|(k, v)| (k.clone(), clamp_temperature(v)))
            .collect();
        // Same entries, same order and same test as upstream's load-time warning.
        let entries = raw_by_options
            .iter()
            .zip(&by_options)
            .map(|((key, raw), (_, applied))| (key.clone(), raw, *applied))
            .chain(
                raw_by_type
                    .iter()
                    .zip(by_type)
                    .enumerate()
                    .map(|(i, (raw, applied))| (format!("temperature[{i}]"), raw, applied)),
            );
        let clamped = entries
            .filter(|(_, raw, applied)| python_float(raw) != Some(*applied))
            .map(|(entry, raw, applied)| ClampedTemperature {
                entry,
                raw: py_repr(raw),
                applied,
            })
            .collect();
        Ok(Temperatures {
            by_type,
            by_options,
            clamped,
        })
    }
}

/// Attention pattern of one encoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Every token attends to every token (`full_attention`), with the global RoPE theta.
    Full,
    /// Tokens attend within `|i - j| <= local_attention / 2` (`sliding_attention`), local theta.
    Sliding,
}

/// The ModernBERT encoder shape (`encoder/config.json`), in either transformers layout.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// Token vocabulary size.
    pub vocab_size: usize,
    /// Model width `d`.
    pub hidden_size: usize,
    /// GeGLU width `I` (the input projection is `2I` wide).
    pub intermediate_size: usize,
    /// Number of encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer.
    pub num_attention_heads: usize,
    /// Sliding window width; a sliding layer sees `local_attention / 2` tokens each side.
    pub local_attention: usize,
    /// RoPE theta of full-attention layers.
    pub global_rope_theta: f64,
    /// RoPE theta of sliding-window layers.
    pub local_rope_theta: f64,
    /// LayerNorm epsilon of the encoder norms.
    pub norm_eps: f64,
    /// Longest sequence the position tables are meant for.
    pub max_position_embeddings: usize,
    /// Attention type of each layer, `num_hidden_layers` entries.
    pub layer_types: Vec<LayerType>,
    /// `hidden_activation` as written (upstream's checkpoints use `gelu`, i.e. exact erf GELU).
    pub hidden_activation: String,
    /// Whether the encoder's attention, MLP and norm layers carry biases (false for Laya).
    pub biases: bool,
}

impl EncoderConfig {
    /// Reads and checks `encoder/config.json`.
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let value = read_json(path)?;
        Self::from_json(path, &value)
    }

    /// Builds the config from parsed JSON, with Hugging Face's ModernBERT defaults for absent keys.
    pub fn from_json(path: &Path, value: &Value) -> Result<Self, CheckpointError> {
        let map = value
            .as_object()
            .ok_or_else(|| invalid(path, "must hold a JSON object"))?;
        let int = |key: &str, default: usize| positive_int(path, map, key, default);
        let float = |keys: &[&str], default: f64| -> Result<f64, CheckpointError> {
            for key in keys {
                match map.get(*key) {
                    None | Some(Value::Null) => continue,
                    Some(Value::Number(n)) => return Ok(number_as_f64(n)),
                    Some(other) => {
                        return Err(invalid(
                            path,
                            format!("'{key}' must be a number, got {}", py_repr(other)),
                        ));
                    }
                }
            }
            Ok(default)
        };
        let vocab_size = int("vocab_size", 50368)?;
        let hidden_size = int("hidden_size", 768)?;
        let intermediate_size = int("intermediate_size", 1152)?;
        let num_hidden_layers = int("num_hidden_layers", 22)?;
        let num_attention_heads = int("num_attention_heads", 12)?;
        if hidden_size % num_attention_heads != 0 {
            return Err(invalid(
                path,
                format!("'hidden_size' {hidden_size} is not divisible by 'num_attention_heads' {num_attention_heads}"),
            ));
        }
        let local_attention = int("local_attention", 128)?;
        let every = int("global_attn_every_n_layers", 3)?;
        let norm_eps = float(&["norm_eps", "layer_norm_eps"], 1e-5)?;
        let max_position_embeddings = int("max_position_embeddings", 8192)?;
        let (global_rope_theta, local_rope_theta) = rope_thetas(
            path,
            map,
            float(&["global_rope_theta"], 160_000.0)?,
            float(&["local_rope_theta"], 10_000.0)?,
        )?;
        let layer_types = match map.get("layer_types") {
            None | Some(Value::Null) => (0..num_hidden_layers)
                .map(|i| {
                    if i % every == 0 {
                        LayerType::Full
                    } else {
                        LayerType::Sliding
                    }
                })
                .collect(),
            Some(Value::Array(items)) => {
                if items.len() != num_hidden_layers {
                    return Err(invalid(
                        path,
                        format!(
                            "'layer_types' has {} entries but 'num_hidden_layers' is {num_hidden_layers}",
                            items.len()
                        ),
                    ));
                }
                items
                    .iter()
                    .map(|item| match item.as_str() {
                        Some("full_attention") => Ok(LayerType::Full),
                        Some("sliding_attention") => Ok(LayerType::Sliding),
                        _ => Err(invalid(
                            path,
                            format!(
                                "'layer_types' entries must be \"full_attention\" or \"sliding_attention\", got {}",
                                py_repr(item)
                            ),
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            Some(other) => {
                return Err(invalid(
                    path,
                    format!("'layer_types' must be a list, got {}", py_repr(other)),
                ));
            }
        };
        let hidden_activation = match map.get("hidden_activation") {
            None => "gelu".to_owned(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(invalid(
                    path,
                    format!("'hidden_activation' must be a string, got {}", py_repr(other)),
                ));
            }
        };
        let biases = ["attention_bias", "mlp_bias", "norm_bias"]
            .iter()
            .any(|k| map.get(*k).and_then(Value::as_bool).unwrap_or(false));
        Ok(Self {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            local_attention,
            global_rope_theta,
            local_rope_theta,
            norm_eps,
            max_position_embeddings,
            layer_types,
            hidden_activation,
            biases,
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// RoPE thetas: transformers-5 `rope_parameters` (per layer type, or one flat theta) take
/// precedence over the transformers-4 `global_rope_theta` / `local_rope_theta`, as in upstream.
fn rope_thetas(path: &Path, map: &Map<String, Value>, global: f64, local: f64) -> Result<(f64, f64), CheckpointError> {
    let Some(rope) = map.get("rope_parameters") else {
        return Ok((global, local));
    };
    let Some(rope) = rope.as_object() else {
        // Upstream ignores a non-dict `rope_parameters`.
        return Ok((global, local));
    };
    let theta_of = |v: Option<&Value>| -> Result<Option<f64>, CheckpointError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(Some(number_as_f64(n))),
            Some(other) => Err(invalid(
                path,
                format!("'rope_parameters' theta must be a number, got {}", py_repr(other)),
            )),
        }
    };
    let flat = theta_of(rope.get("rope_theta"))?;
    let per_type = |layer: &str, fallback: f64| -> Result<f64, CheckpointError> {
        let theta = match rope.get(layer) {
            Some(Value::Object(params)) => theta_of(params.get("rope_theta"))?,
            _ => flat,
        };
        Ok(theta.unwrap_or(fallback))
    };
    Ok((
        per_type("full_attention", global)?,
        per_type("sliding_attention", local)?,
    ))
}

/// Reads a JSON file, with errors that name it.
pub(crate) fn read_json(path: &Path) -> Result<Value, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: PathBuf::from(path),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| invalid(path, format!("not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent(v: Value) -> Result<AgentConfig, CheckpointError> {
        AgentConfig::from_json(Path::new("rl_agent_config.json"), &v)
    }

    #[test]
    fn temperatures_are_clamped_like_upstream() {
        let cfg = agent(json!({
            "encoder": "x", "head_layers": 2,
            "temperature": [1.6369, "2", true],
            "temperature_by_options": {"choice:11+": 0.1006, "score:6-10": 7.5, "noul:2": "abc", "choice:2": 1.9064}
        }))
        .expect("valid config");
        let t = &cfg.temperatures;
        assert_eq!(t.by_type, [1.6369, 2.0, 1.0]);
        assert_eq!(t.by_options[0], ("choice:11+".to_owned(), 0.5));
        assert_eq!(t.by_options[1], ("score:6-10".to_owned(), 5.0));
        let flagged: Vec<&str> = t.clamped.iter().map(|c| c.entry.as_str()).collect();
        assert_eq!(flagged, ["choice:11+", "score:6-10", "noul:2"]);
        assert_eq!(cfg.max_len, 512);
        assert_eq!(cfg.head_max_len, 192);
    }

    #[test]
    fn agent_config_errors_name_the_key() {
        let err = agent(json!({"encoder": "x"})).expect_err("head_layers missing");
        assert!(
            err.to_string().contains("missing configuration keys [\"head_layers\"]"),
            "{err}"
        );
        let err = agent(json!({"encoder": "x", "head_layers": 2, "max_len": 0})).expect_err("bad max_len");
        assert!(
            err.to_string().contains("'max_len' must be a positive integer, got 0"),
            "{err}"
        );
        let err = agent(json!({"encoder": "x", "head_layers": 2, "temperature": [1, 2]})).expect_err("short list");
        assert!(
            err.to_string().contains("'temperature' must be a list of 3 numbers"),
            "{err}"
        );
    }

    #[test]
    fn encoder_config_reads_both_transformers_layouts() {
        let path = Path::new("encoder/config.json");
        let v5 = EncoderConfig::from_json(
            path,
            &json!({"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 3, "norm_eps": 1e-6,
                    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                    "rope_parameters": {"full_attention": {"rope_theta": 160000.0}, "sliding_attention": {"rope_theta": 160000.0}}}),
        )
        .expect("v5 config");
        assert_eq!(
            (v5.global_rope_theta, v5.local_rope_theta, v5.norm_eps),
            (160000.0, 160000.0, 1e-6)
        );
        assert_eq!(
            v5.layer_types,
            [LayerType::Full, LayerType::Sliding, LayerType::Sliding]
        );
        assert_eq!(v5.head_dim(), 32);
        let v4 = EncoderConfig::from_json(
            path,
            &json!({"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 4, "layer_norm_eps": 1e-6,
                    "global_attn_every_n_layers": 2, "global_rope_theta": 80000.0, "local_rope_theta": 5000.0}),
        )
        .expect("v4 config");
        assert_eq!(
            (v4.global_rope_theta, v4.local_rope_theta, v4.norm_eps),
            (80000.0, 5000.0, 1e-6)
        );
        assert_eq!(
            v4.layer_types,
            [LayerType::Full, LayerType::Sliding, LayerType::Full, LayerType::Sliding]
        );
        let err = EncoderConfig::from_json(
            path,
            &json!({"num_hidden_layers": 2, "layer_types": ["full_attention"]}),
        )
        .expect_err("length");
        assert!(err.to_string().contains("'layer_types' has 1 entries"), "{err}");
    }
}
