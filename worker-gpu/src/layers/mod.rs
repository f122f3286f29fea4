//! The building blocks shared by the encoder and the decision head: linear layers in the compute
//! precision (or int8), float32 LayerNorm, RoPE tables and attention with cached masks.

pub(crate) mod attention;
pub(crate) mod cpu_attention;
pub(crate) mod cpu_kernels;
pub(crate) mod cpu_matmul;
pub(crate) mod linear;
pub(crate) mod norm;
pub(crate) mod rotary;
