//! Content addressing: every blob is named by the lowercase hex SHA-256 of its bytes.
use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256, 64 characters.
pub type Sha256Hex = String;

pub fn sha256_hex(bytes: &[u8]) -> Sha256Hex {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_lowercase_hex_sha256() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
