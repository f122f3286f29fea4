//! The defaults of the limits a request and a forward are held to, in one place for every crate
//! that sets or checks them: the configuration (`layad-config`), the worker protocol and its
//! command line (`layad-proto`), and the engines. A configured value replaces a default; nothing
//! else here.

/// Upstream 0.4.15's default `LAYA_MAX_TOKEN_BUDGET`: the longest `max_len`/`head_max_len` a request
/// may ask for.
pub const DEFAULT_MAX_TOKEN_BUDGET: usize = 8192;

/// Most rows in one forward, unless configured (`pool.max_rows`, the workers' `--max-rows`).
pub const DEFAULT_MAX_ROWS: u32 = 64;

/// Most tokens (sum of row lengths) in one forward, unless configured (`pool.max_batch_tokens`,
/// the workers' `--max-batch-tokens`): 64 rows of 512 tokens.
pub const DEFAULT_MAX_BATCH_TOKENS: u32 = 32_768;
