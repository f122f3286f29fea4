//! Fresh random identifiers from the operating system: the nonce of each worker start and the
//! random part of an instance directory's name.

/// `bytes` random bytes as lower-case hex.
pub fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buffer = vec![0u8; bytes];
    getrandom::fill(&mut buffer)?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_gives_new_hex_of_the_asked_length() {
        let (a, b) = (random_hex(16).expect("random"), random_hex(16).expect("random"));
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }
}
