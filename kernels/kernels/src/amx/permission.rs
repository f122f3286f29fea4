//! Whether the CPU has AMX, and Linux's permission for the tile registers: their 8 KiB of state
//! is not saved for a process on a context switch until it asks (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, Linux 5.16 and later); a tile instruction before that kills the process.

/// CPUID leaf 7's EDX bits for AMX-BF16, AMX-TILE and AMX-INT8.
#[cfg(target_arch = "x86_64")]
const AMX_BITS: u32 = 1 << 22 | 1 << 24 | 1 << 25;

/// Whether the CPU reports AMX-TILE, AMX-INT8 and AMX-BF16.
pub(super) fn cpu_has_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID exists on every x86-64 CPU; leaf 7 only where the highest leaf reaches it.
        let highest = std::arch::x86_64::__cpuid(0).eax;
        highest >= 7 && std::arch::x86_64::__cpuid_count(7, 0).edx & AMX_BITS == AMX_BITS
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Asks the kernel for the tile data state; the error says why it was not granted.
pub(super) fn request_tile_data() -> Result<(), String> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        /// `ARCH_REQ_XCOMP_PERM` and the tile data's state component (`XFEATURE_XTILEDATA`), from
        /// Linux's `arch/x86/include/uapi/asm/prctl.h` and `fpu/types.h`.
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes two integers and touches no memory of
        // the process; it only changes which state the kernel saves for it.
        #[allow(unsafe_code)]
        let status = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
        if status == 0 {
            Ok(())
        } else {
            Err(format!(
                "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: {} (Linux 5.16 or later grants it)",
                std::io::Error::last_os_error()
            ))
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        Err("AMX's tile state is requested from Linux only".to_owned())
    }
}
