//! The candle engine: ModernBERT encoder, decision head and act head on CPU, Metal or CUDA.
//! Empty until the candle model issue fills it in; it exists so the workspace layout is final.
