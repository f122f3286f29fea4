//! The kernel family a CPU forward runs ([`CpuKernels`]): detected once at load (or named with
//! `--cpu-kernels`), reported in the worker's start-up line and `/health`, and the one place that
//! turns a family into `pulp`'s SIMD token.

use std::fmt;

#[cfg(target_arch = "x86_64")]
use pulp::Simd;
use pulp::WithSimd;

/// The SIMD kernels a CPU forward uses for its matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuKernels {
    /// The AVX-512 float32 kernels, with the int8 and bf16 products on AMX's tile registers
    /// (`crate::amx`: Sapphire Rapids and later Xeons, where Linux grants the tiles).
    Amx,
    /// 512-bit AVX-512F kernels (x86-64 CPUs that have them).
    Avx512,
    /// 256-bit AVX2 + FMA kernels (x86-64 since about 2013).
    Avx2,
    /// candle's matmul (the `gemm` crate and its own run-time dispatch): other CPUs (Apple, Arm).
    Gemm,
}

impl CpuKernels {
    /// The best family this CPU runs.
    pub fn detect() -> Self {
        [Self::Amx, Self::Avx512, Self::Avx2]
            .into_iter()
            .find(|k| k.available())
            .unwrap_or(Self::Gemm)
    }

    /// Parses `auto` (the best available: `None`), `amx`, `avx512`, `avx2` or `gemm`.
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(None),
            "amx" => Ok(Some(Self::Amx)),
            "avx512" => Ok(Some(Self::Avx512)),
            "avx2" => Ok(Some(Self::Avx2)),
            "gemm" => Ok(Some(Self::Gemm)),
            _ => Err(format!(
                "unknown CPU kernels '{text}'; expected auto, amx, avx512, avx2 or gemm"
            )),
        }
    }

    /// Whether this CPU can run the family.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Amx => pulp::x86::V4::try_new().is_some() && crate::amx::Amx::detect().is_ok(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => pulp::x86::V4::try_new().is_some(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => pulp::x86::V3::try_new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            Self::Amx | Self::Avx512 | Self::Avx2 => false,
            Self::Gemm => true,
        }
    }

    /// `amx`, `avx512`, `avx2` or `gemm`: what the worker reports in its start-up line and in
    /// `/health`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amx => "amx",
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Gemm => "gemm",
        }
    }

    /// What the worker reports in `/health`: [`CpuKernels::as_str`], and where the CPU has AMX but
    /// the operating system refused its tiles, why (`avx512 (AMX refused: …)`), so an operator
    /// sees why a Xeon with AMX runs slower kernels.
    pub fn report(self) -> String {
        match crate::amx::Amx::detect() {
            Err(refused @ crate::amx::AmxUnavailable::Refused(_)) if self != Self::Amx => {
                format!("{} ({refused})", self.as_str())
            }
            _ => self.as_str().to_owned(),
        }
    }

    /// Runs `op` with this family's SIMD: AVX-512 (also beside AMX) or AVX2 as named (portable code
    /// if the CPU lacks it), and for `Gemm` whatever `pulp` finds best on this CPU.
    pub fn dispatch<Op: WithSimd>(self, op: Op) -> Op::Output {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Amx | Self::Avx512 => match pulp::x86::V4::try_new() {
                Some(simd) => Simd::vectorize(simd, op),
                None => Simd::vectorize(pulp::Scalar::new(), op),
            },
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => match pulp::x86::V3::try_new() {
                Some(simd) => Simd::vectorize(simd, op),
                None => Simd::vectorize(pulp::Scalar::new(), op),
            },
            _ => pulp::Arch::new().dispatch(op),
        }
    }

    /// Columns per packed panel: two registers of the family's width.
    pub fn panel_width(self) -> usize {
        match self {
            Self::Amx | Self::Avx512 => 32,
            Self::Avx2 | Self::Gemm => 16,
        }
    }
}

impl fmt::Display for CpuKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_detects_families() {
        assert_eq!(CpuKernels::parse("auto"), Ok(None));
        assert_eq!(CpuKernels::parse(" AVX2 "), Ok(Some(CpuKernels::Avx2)));
        assert_eq!(CpuKernels::parse("avx512"), Ok(Some(CpuKernels::Avx512)));
        assert_eq!(CpuKernels::parse("gemm"), Ok(Some(CpuKernels::Gemm)));
        assert_eq!(CpuKernels::parse("AMX"), Ok(Some(CpuKernels::Amx)));
        assert!(CpuKernels::parse("sse").is_err_and(|e| e.contains("'sse'")));
        let best = CpuKernels::detect();
        assert!(best.available());
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            matches!(best, CpuKernels::Amx | CpuKernels::Avx512),
            std::arch::is_x86_feature_detected!("avx512f")
        );
        assert_eq!(
            best == CpuKernels::Amx,
            CpuKernels::Avx512.available() && crate::amx::Amx::detect().is_ok()
        );
    }
}
