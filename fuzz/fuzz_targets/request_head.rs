//! Fuzzes the request-head check (`layad::http::protocol::check_head`), which sees every byte a
//! client sends before hyper does: it must never panic, and its answers must stay consistent with
//! themselves and with the limits it documents.
#![no_main]

use layad::http::protocol::{Head, MAX_HEAD_BYTES, check_head};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match check_head(data) {
        Ok(Some(Head { len, framing })) => {
            assert!(len <= data.len(), "head of {len} bytes in {} received", data.len());
            assert!(len <= MAX_HEAD_BYTES, "accepted a head of {len} bytes");
            // The head alone is the same head: what follows it (the body, a pipelined request)
            // never changes the verdict.
            assert_eq!(
                check_head(&data[..len]),
                Ok(Some(Head { len, framing })),
                "the head without what follows it"
            );
        }
        // Waiting for more is only allowed while the head can still fit.
        Ok(None) => assert!(data.len() <= MAX_HEAD_BYTES, "waits with {} bytes", data.len()),
        Err(refusal) => {
            assert!(
                matches!(refusal.status.as_u16(), 400 | 414 | 431 | 501),
                "refused with {}",
                refusal.status
            );
            assert!(!refusal.detail.is_empty(), "a refusal names its problem");
        }
    }
});
