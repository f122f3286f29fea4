//! CUDA specifics of the engine: the math settings every CUDA forward relies on (no TF32) and the
//! device as its driver describes it (name, memory, compute capability) for Describe and `/health`.
//! The driver is asked only in builds with the `cuda` feature; other builds have no CUDA device to
//! ask about, and say so.

use candle_core::Device;
use layad_proto::GpuInfo;

/// Why a build without the `cuda` feature cannot open a CUDA device.
pub const NOT_BUILT: &str = "this build has no CUDA backend (build layad-worker-gpu with --features cuda)";

/// Opens CUDA device `ordinal` with [`configure_math`]'s settings, or says why it cannot.
#[cfg(feature = "cuda")]
pub fn open(ordinal: usize) -> Result<Device, String> {
    let device = Device::new_cuda(ordinal).map_err(|e| e.to_string())?;
    configure_math();
    Ok(device)
}

/// Opens CUDA device `ordinal`: never, in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub fn open(_ordinal: usize) -> Result<Device, String> {
    Err(NOT_BUILT.to_owned())
}

/// Makes float32 matrix products accumulate in float32 (TF32 off; candle's default, set here so that
/// nothing else in the process can have changed it), and f16/bf16 products accumulate in float32
/// too. With TF32 a float32 forward drifts past the 1e-4 the goldens allow.
pub fn configure_math() {
    candle_core::cuda::set_gemm_reduced_precision_f32(false);
    candle_core::cuda::set_gemm_reduced_precision_f16(false);
    candle_core::cuda::set_gemm_reduced_precision_bf16(false);
}

/// Whether float32 CUDA matrix products may use TF32 now (never in a build without CUDA; candle's
/// stand-in backend answers `true` there, about GEMMs that cannot run).
pub fn tf32() -> bool {
    #[cfg(feature = "cuda")]
    return candle_core::cuda::gemm_reduced_precision_f32();
    #[cfg(not(feature = "cuda"))]
    false
}

/// The GPU behind `device`: `Ok(None)` for a CPU or Metal device (Metal has no driver query here),
/// an error when the driver could not be asked.
pub fn describe(device: &Device) -> Result<Option<GpuInfo>, String> {
    match device {
        Device::Cuda(cuda) => query(cuda).map(Some),
        Device::Cpu | Device::Metal(_) => Ok(None),
    }
}

#[cfg(feature = "cuda")]
fn query(device: &candle_core::CudaDevice) -> Result<GpuInfo, String> {
    let stream = device.cuda_stream();
    let context = stream.context();
    let asking = |what: &str, e: candle_core::cuda::cudarc::driver::DriverError| {
        format!("the CUDA driver did not tell the device's {what}: {e}")
    };
    let name = context.name().map_err(|e| asking("name", e))?;
    let (major, minor) = context
        .compute_capability()
        .map_err(|e| asking("compute capability", e))?;
    let total = context.total_mem().map_err(|e| asking("memory", e))?;
    Ok(GpuInfo {
        name,
        total_memory_bytes: u64::try_from(total).unwrap_or(u64::MAX),
        compute_capability: Some((
            u32::try_from(major).unwrap_or_default(),
            u32::try_from(minor).unwrap_or_default(),
        )),
        tf32: tf32(),
    })
}

#[cfg(not(feature = "cuda"))]
fn query(_device: &candle_core::CudaDevice) -> Result<GpuInfo, String> {
    // candle's stand-in backend cannot even create such a device; kept total for the type's sake.
    Err(NOT_BUILT.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_no_gpu_and_tf32_stays_off() {
        configure_math();
        assert!(!tf32());
        assert_eq!(describe(&Device::Cpu), Ok(None));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_build_without_cuda_says_so_instead_of_opening_a_device() {
        assert_eq!(open(0).map(|_| ()), Err(NOT_BUILT.to_owned()));
    }
}
