//! Random-weight Laya checkpoints of the published sizes, written as real checkpoint directories
//! (configs, the fixture's tokenizer, an F16 `model.safetensors` with the full state dict including
//! `temperature`) so that upstream's `laya.Agent` and the candle engine load the same files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::{Value, json};

/// How [`ModelSpec::forward_flops`] counts (2 FLOPs per multiply-add): every token through every
/// encoder matrix, the first head layer and the last head layer's in_proj; attention over the keys
/// each query may see (full layers and head layer 1: all `len`, sliding layers: at most
/// `local_attention + 1`); the last head layer's attention, out_proj and FFN and the scorer on 4
/// read-out rows per row (first token and 3 markers). Embedding lookups, norms and softmax: not
/// counted.
pub(crate) const FLOPS_MODEL: &str = "2 x multiply-adds: tokens x (encoder matrices + head layer 1 + last head in_proj + 2*d*keys seen; full/head: len, sliding: min(len, local_attention+1)) + 4*rows x (last head layer attention + out_proj + FFN + scorer)";

/// The shape of one published checkpoint.
#[derive(Clone, Debug)]
pub(crate) struct ModelSpec {
    /// Short name used in tables and directory names.
    pub(crate) name: &'static str,
    /// Base encoder id written into `rl_agent_config.json`.
    pub(crate) encoder_id: &'static str,
    /// Model width.
    pub(crate) hidden: usize,
    /// GeGLU width.
    pub(crate) intermediate: usize,
    /// Encoder layers.
    pub(crate) layers: usize,
    /// Attention heads.
    pub(crate) heads: usize,
    /// Embedding rows.
    pub(crate) vocab: usize,
    /// Sliding window width.
    pub(crate) local_attention: usize,
    /// Every n-th layer (from 0) is global.
    pub(crate) global_every: usize,
    /// RoPE theta of global layers.
    pub(crate) global_theta: f64,
    /// RoPE theta of sliding layers.
    pub(crate) local_theta: f64,
    /// Which fixture checkpoint lends its tokenizer and config templates.
    pub(crate) fixture: laya::routing::CheckpointName,
}

impl ModelSpec {
    /// ModernBERT-large, the english and typed-decisions encoder.
    pub(crate) fn modernbert_large() -> Self {
        Self {
            name: "modernbert-large",
            encoder_id: "answerdotai/ModernBERT-large",
            hidden: 1024,
            intermediate: 2624,
            layers: 28,
            heads: 16,
            vocab: 50368,
            local_attention: 128,
            global_every: 3,
            global_theta: 160_000.0,
            local_theta: 10_000.0,
            fixture: laya::routing::CheckpointName::English,
        }
    }

    /// mmBERT-base, the multilingual encoder; `vocab` may be cut to save memory and disk.
    pub(crate) fn mmbert_base(vocab: usize) -> Self {
        Self {
            name: "mmbert-base",
            encoder_id: "jhu-clsp/mmBERT-base",
            hidden: 768,
            intermediate: 1152,
            layers: 22,
            heads: 12,
            vocab,
            local_attention: 128,
            global_every: 3,
            global_theta: 160_000.0,
            local_theta: 160_000.0,
            fixture: laya::routing::CheckpointName::Multilingual,
        }
    }

    /// A small ModernBERT (8 layers of width 384, not a published size) whose short forward takes
    /// tens of milliseconds on one core: the scheduling benchmark's model, where queueing, not one
    /// forward, dominates latency. The vocabulary covers the fixture tokenizer it borrows.
    pub(crate) fn modernbert_mini() -> Self {
        Self {
            name: "modernbert-mini",
            encoder_id: "answerdotai/ModernBERT-base",
            hidden: 384,
            intermediate: 576,
            layers: 8,
            heads: 6,
            vocab: 1024,
            local_attention: 128,
            global_every: 3,
            global_theta: 160_000.0,
            local_theta: 10_000.0,
            fixture: laya::routing::CheckpointName::English,
        }
    }

    fn layer_is_global(&self, i: usize) -> bool {
        i.is_multiple_of(self.global_every)
    }

    /// FLOPs of one forward over `rows` rows of `len` tokens as the engine executes it; see
    /// [`FLOPS_MODEL`].
    pub(crate) fn forward_flops(&self, len: usize, rows: usize) -> f64 {
        let (d, i) = (self.hidden as f64, self.intermediate as f64);
        let tokens = (len * rows) as f64;
        let window = len.min(self.local_attention + 1) as f64;
        let keys_seen: f64 = (0..self.layers)
            .map(|l| if self.layer_is_global(l) { len as f64 } else { window })
            .sum::<f64>()
            + len as f64;
        // Multiply-adds per token: encoder matrices, head layer 1, the last layer's in_proj.
        let per_token = self.layers as f64 * (4.0 * d * d + 3.0 * i * d) + 12.0 * d * d + 3.0 * d * d;
        // Per read-out row (first token + 3 markers): the last layer's attention, out_proj and
        // FFN, then the scorer.
        let read_out = (4 * rows) as f64;
        let per_read_out = 2.0 * len as f64 * d + 9.0 * d * d + d * d;
        2.0 * (tokens * (per_token + 2.0 * d * keys_seen) + read_out * per_read_out)
    }

    /// Every tensor of the state dict with its shape, in upstream's naming.
    fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (d, i) = (self.hidden, self.intermediate);
        let mut t: Vec<(String, Vec<usize>)> = vec![
            ("encoder.embeddings.tok_embeddings.weight".into(), vec![self.vocab, d]),
            ("encoder.embeddings.norm.weight".into(), vec![d]),
            ("encoder.final_norm.weight".into(), vec![d]),
            ("type_emb.weight".into(), vec![3, d]),
            ("scorer.0.weight".into(), vec![d]),
            ("scorer.0.bias".into(), vec![d]),
            ("scorer.1.weight".into(), vec![d, d]),
            ("scorer.1.bias".into(), vec![d]),
            ("scorer.3.weight".into(), vec![1, d]),
            ("scorer.3.bias".into(), vec![1]),
            ("act_head.0.weight".into(), vec![256, d + 4]),
            ("act_head.0.bias".into(), vec![256]),
            ("act_head.2.weight".into(), vec![2, 256]),
            ("act_head.2.bias".into(), vec![2]),
            ("temperature".into(), vec![3]),
        ];
        for l in 0..self.layers {
            let p = format!("encoder.layers.{l}");
            if l > 0 {
                t.push((format!("{p}.attn_norm.weight"), vec![d]));
            }
            t.push((format!("{p}.attn.Wqkv.weight"), vec![3 * d, d]));
            t.push((format!("{p}.attn.Wo.weight"), vec![d, d]));
            t.push((format!("{p}.mlp_norm.weight"), vec![d]));
            t.push((format!("{p}.mlp.Wi.weight"), vec![2 * i, d]));
            t.push((format!("{p}.mlp.Wo.weight"), vec![d, i]));
        }
        for j in 0..2 {
            let p = format!("head.layers.{j}");
            t.push((format!("{p}.self_attn.in_proj_weight"), vec![3 * d, d]));
            t.push((format!("{p}.self_attn.in_proj_bias"), vec![3 * d]));
            t.push((format!("{p}.self_attn.out_proj.weight"), vec![d, d]));
            t.push((format!("{p}.self_attn.out_proj.bias"), vec![d]));
            t.push((format!("{p}.linear1.weight"), vec![4 * d, d]));
            t.push((format!("{p}.linear1.bias"), vec![4 * d]));
            t.push((format!("{p}.linear2.weight"), vec![d, 4 * d]));
            t.push((format!("{p}.linear2.bias"), vec![d]));
            for norm in ["norm1", "norm2"] {
                t.push((format!("{p}.{norm}.weight"), vec![d]));
                t.push((format!("{p}.{norm}.bias"), vec![d]));
            }
        }
        t
    }

    fn encoder_config(&self, template: &Value) -> Value {
        let mut config = template.clone();
        let layer_types: Vec<&str> = (0..self.layers)
            .map(|i| {
                if self.layer_is_global(i) {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        let overrides = json!({
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "vocab_size": self.vocab,
            "local_attention": self.local_attention,
            "global_attn_every_n_layers": self.global_every,
            "max_position_embeddings": 8192,
            "layer_types": layer_types,
            "rope_parameters": {
                "full_attention": {"rope_theta": self.global_theta, "rope_type": "default"},
                "sliding_attention": {"rope_theta": self.local_theta, "rope_type": "default"},
            },
        });
        if let (Some(config), Some(overrides)) = (config.as_object_mut(), overrides.as_object()) {
            for (k, v) in overrides {
                config.insert(k.clone(), v.clone());
            }
        }
        config
    }
}

/// Random weights: matrices N(0, 0.02²) like transformers' init, norm weights 1 ± noise, small biases.
fn random_tensor(name: &str, shape: &[usize]) -> candle_core::Result<Tensor> {
    let device = Device::Cpu;
    let tensor = if name == "temperature" {
        Tensor::new(&[1.6369f32, 1.2514, 1.9834], &device)?
    } else if shape.len() == 2 {
        Tensor::randn(0f32, 0.02, shape, &device)?
    } else if name.contains("norm") || name.starts_with("scorer.0.weight") {
        (Tensor::randn(0f32, 0.05, shape, &device)? + 1.0)?
    } else {
        Tensor::randn(0f32, 0.02, shape, &device)?
    };
    tensor.to_dtype(DType::F16)
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn write_json(path: &Path, value: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes (or reuses, when its recorded spec matches) the checkpoint for `spec` under `root`.
pub(crate) fn ensure_checkpoint(spec: &ModelSpec, root: &Path, fixture_cache: &Path) -> Result<PathBuf, String> {
    let dir = root.join(format!("{}-v{}", spec.name, spec.vocab));
    let marker = dir.join("bench_spec.json");
    let wanted = json!({"spec": format!("{spec:?}"), "format": 1});
    if read_json(&marker).is_ok_and(|v| v == wanted) {
        return Ok(dir);
    }
    let fixture = laya::checkpoint::find_in_hf_cache(fixture_cache, spec.fixture).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir.join("encoder")).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir.join("tokenizer")).map_err(|e| e.to_string())?;
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(
            fixture.dir.join("tokenizer").join(file),
            dir.join("tokenizer").join(file),
        )
        .map_err(|e| format!("copying the fixture tokenizer: {e}"))?;
    }
    let template = read_json(&fixture.dir.join("encoder/config.json"))?;
    write_json(&dir.join("encoder/config.json"), &spec.encoder_config(&template))?;
    let mut agent = read_json(&fixture.dir.join("rl_agent_config.json"))?;
    agent["encoder"] = spec.encoder_id.into();
    agent["head_layers"] = 2.into();
    agent["act_costs"] = json!({"escalate": 0.5});
    agent["max_len"] = 512.into();
    agent["head_max_len"] = 192.into();
    write_json(&dir.join("rl_agent_config.json"), &agent)?;
    eprintln!("writing random {} weights to {} ...", spec.name, dir.display());
    let mut tensors = HashMap::new();
    for (name, shape) in spec.tensors() {
        let tensor = random_tensor(&name, &shape).map_err(|e| format!("{name}: {e}"))?;
        tensors.insert(name, tensor);
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).map_err(|e| e.to_string())?;
    write_json(&marker, &wanted)?;
    Ok(dir)
}
