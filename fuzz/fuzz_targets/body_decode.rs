//! Fuzzes request-body decoding (`ContentEncoding::decode`, gzip/deflate/zstd with the size cap):
//! the first byte picks the coding and the mode, the next two the cap, the rest is the body.
//! Arbitrary bodies must decode within the cap or be refused with 400 or 413; and in round-trip
//! mode the rest is compressed here first, so it must come back exactly (or 413 past the cap).
#![no_main]

use std::io::Write;

use bytes::Bytes;
use layad::http::admission::ContentEncoding;
use libfuzzer_sys::fuzz_target;

const CODINGS: [ContentEncoding; 3] = [ContentEncoding::Gzip, ContentEncoding::Deflate, ContentEncoding::Zstd];

fuzz_target!(|data: &[u8]| {
    let [selector, cap_high, cap_low, rest @ ..] = data else {
        return;
    };
    let coding = CODINGS[usize::from(*selector % 3)];
    // Caps up to 64 KiB: small enough that bodies past them are common.
    let cap = usize::from(u16::from_be_bytes([*cap_high, *cap_low]));
    let round_trip = selector & 0x80 != 0 && coding != ContentEncoding::Zstd;
    let wire = if round_trip {
        compress(coding, selector & 0x40 != 0, rest)
    } else {
        rest.to_vec()
    };
    match coding.decode(Bytes::from(wire), cap) {
        Ok(decoded) => {
            assert!(
                decoded.len() <= cap,
                "{} bytes decoded past a cap of {cap}",
                decoded.len()
            );
            if round_trip {
                assert_eq!(&decoded[..], rest, "{coding:?} round trip");
            }
        }
        Err(error) => {
            let status = error.status.as_u16();
            assert!(matches!(status, 400 | 413), "refused with {status}: {}", error.detail);
            if round_trip {
                assert!(
                    status == 413 && rest.len() > cap,
                    "{coding:?} round trip refused: {}",
                    error.detail
                );
            }
        }
    }
});

/// `data` compressed as `coding` says; `raw` picks raw deflate (as some clients send) over zlib.
fn compress(coding: ContentEncoding, raw: bool, data: &[u8]) -> Vec<u8> {
    let level = flate2::Compression::fast();
    let written = match coding {
        ContentEncoding::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), level);
            encoder.write_all(data).and_then(|()| encoder.finish())
        }
        ContentEncoding::Deflate if raw => {
            let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), level);
            encoder.write_all(data).and_then(|()| encoder.finish())
        }
        _ => {
            let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), level);
            encoder.write_all(data).and_then(|()| encoder.finish())
        }
    };
    written.expect("compressing into memory cannot fail")
}
