# layad-ane-convert: Laya checkpoint -> Core ML "bc1s-masked" ML Programs for layad-worker-ane.
# Owns the package metadata and the process environment every entry point needs (set on import).
"""Core ML converter for the layad Neural Engine worker. See ../README.md for the graph contract."""
import os

NAME = "layad-ane-convert"
__version__ = "0.1.0"

# Before transformers / huggingface_hub / tqdm are imported (tools/fixtures/make_fixtures.py does the same):
os.environ["HF_HUB_OFFLINE"] = "1"                  # never touch the Hub; checkpoints are local dirs
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ.pop("LAYA_CPU_AMP", None)                 # the upstream reference is plain FP32 on the CPU
os.environ.setdefault("TQDM_DISABLE", "1")           # coremltools' per-pass progress bars
