//! The running macOS version and the oldest macOS layad's Apple back ends run on, so that a worker
//! refuses an older system at start-up, naming both versions, instead of failing inside Metal or Core ML.
//!
//! The version comes from `/System/Library/CoreServices/SystemVersion.plist` (the file `sw_vers`
//! and Python's `platform.mac_ver()` read); parsing it is plain text, tested on any OS.

use std::fmt;

/// Oldest macOS the Metal engine and the Core ML executor run on. Metal: candle 0.11.1's
/// `MetalDevice::new` creates an `MTLResidencySetDescriptor` (macOS 15; on 14 objc2 panics, "class
/// MTLResidencySetDescriptor could not be found") and its `gemv.metal` uses `bfloat` unguarded
/// (Metal 3.1, macOS 14). Core ML: `worker-ane/convert` writes ML programs with
/// `minimum_deployment_target = macOS15`, which an older Core ML does not load.
pub const MIN_MACOS: MacosVersion = MacosVersion::new(15, 0);

/// Where macOS records its version.
const SYSTEM_VERSION_PLIST: &str = "/System/Library/CoreServices/SystemVersion.plist";

/// A macOS version, `major.minor` (the patch level changes nothing layad needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MacosVersion {
    /// 15 for Sequoia.
    pub major: u32,
    /// The point release.
    pub minor: u32,
}

impl MacosVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// Parses `15`, `14.6` or `14.6.1`.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = match parts.next() {
            Some(minor) => minor.parse().ok()?,
            None => 0,
        };
        Some(Self { major, minor })
    }

    /// The `ProductVersion` of a `SystemVersion.plist`.
    pub fn from_system_version_plist(text: &str) -> Option<Self> {
        let after_key = &text[text.find("<key>ProductVersion</key>")? + "<key>ProductVersion</key>".len()..];
        let value = after_key.trim_start().strip_prefix("<string>")?;
        Self::parse(&value[..value.find("</string>")?])
    }

    /// The running system's version; `None` off macOS or when it cannot be read.
    pub fn running() -> Option<Self> {
        if !cfg!(target_os = "macos") {
            return None;
        }
        let text = std::fs::read_to_string(SYSTEM_VERSION_PLIST).ok()?;
        Self::from_system_version_plist(&text)
    }

    /// `Err` naming `what`, both versions and why, when this version is older than [`MIN_MACOS`].
    pub fn supports(self, what: &str) -> Result<(), String> {
        if self >= MIN_MACOS {
            Ok(())
        } else {
            Err(format!(
                "{what} needs macOS {MIN_MACOS} or later; this is macOS {self} (README.md, \"Minimum macOS\")"
            ))
        }
    }
}

impl fmt::Display for MacosVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(MacosVersion::parse("14.6.1"), Some(MacosVersion::new(14, 6)));
        assert_eq!(MacosVersion::parse("15"), Some(MacosVersion::new(15, 0)));
        assert_eq!(MacosVersion::parse(" 26.0 "), Some(MacosVersion::new(26, 0)));
        for bad in ["", "fifteen", "15.x", ".1"] {
            assert_eq!(MacosVersion::parse(bad), None, "{bad:?}");
        }
        assert!(MacosVersion::new(14, 7) < MIN_MACOS && MacosVersion::new(15, 0) >= MIN_MACOS);
        assert!(MacosVersion::new(26, 0) > MacosVersion::new(15, 6));
        assert_eq!(MacosVersion::new(15, 1).to_string(), "15.1");
    }

    #[test]
    fn the_product_version_is_read_from_the_system_version_plist() {
        // The layout of the file on macOS 14.6.1 (other keys left out).
        let plist = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>ProductBuildVersion</key>
	<string>23G93</string>
	<key>ProductName</key>
	<string>macOS</string>
	<key>ProductVersion</key>
	<string>14.6.1</string>
</dict>
</plist>
"#;
        let version = MacosVersion::from_system_version_plist(plist);
        assert_eq!(version, Some(MacosVersion::new(14, 6)));
        let refused = MacosVersion::new(14, 6).supports("Metal").expect_err("14.6 is too old");
        assert_eq!(
            refused,
            "Metal needs macOS 15.0 or later; this is macOS 14.6 (README.md, \"Minimum macOS\")"
        );
        assert_eq!(MacosVersion::new(15, 0).supports("Metal"), Ok(()));
        assert_eq!(MacosVersion::from_system_version_plist("<dict></dict>"), None);
        if !cfg!(target_os = "macos") {
            assert_eq!(MacosVersion::running(), None);
        }
    }
}
