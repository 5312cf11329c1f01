//! File names as the kernel has them (bytes, not necessarily UTF-8) in records that are JSON text.
//!
//! A lossy decoding would let two names share one record (`bad\xff` and `bad\xfe` both become
//! `bad\u{FFFD}`), so a recorded name is a display form that is exact for every UTF-8 name, plus,
//! only for a name that is not UTF-8, its raw bytes in standard base64. The display form writes
//! each byte that is not part of valid UTF-8 as `\xHH`; it can collide with a UTF-8 name that
//! holds those characters literally, which is why the base64 form is there: a record without it
//! is the UTF-8 name itself, a record with it is exactly those bytes.
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A name as recorded: the display form, and the base64 of the raw bytes when they are not
/// UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedName {
    pub display: String,
    pub base64: Option<String>,
}

impl RecordedName {
    pub fn new(raw: &[u8]) -> Self {
        match std::str::from_utf8(raw) {
            Ok(name) => Self {
                display: name.to_owned(),
                base64: None,
            },
            Err(_) => Self {
                display: display_bytes(raw),
                base64: Some(STANDARD.encode(raw)),
            },
        }
    }
}

/// The display form of a name: valid UTF-8 as it is, each other byte as `\xHH` (lowercase hex).
pub fn display_bytes(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        out.push_str(chunk.valid());
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// The raw bytes of a recorded name: the base64 form when there is one, else the display form
/// (then the name was UTF-8). `None` when the base64 form is not valid base64.
pub fn raw_bytes(display: &str, base64: Option<&str>) -> Option<Vec<u8>> {
    match base64 {
        Some(b64) => STANDARD.decode(b64).ok(),
        None => Some(display.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_names_are_recorded_as_they_are_without_base64() {
        let name = RecordedName::new("café/naïve \\xff.txt".as_bytes());
        assert_eq!(name.display, "café/naïve \\xff.txt");
        assert_eq!(name.base64, None);
    }

    #[test]
    fn names_that_differ_in_invalid_bytes_stay_distinct() {
        let ff = RecordedName::new(b"bad\xff");
        let fe = RecordedName::new(b"bad\xfe");
        assert_eq!(ff.display, "bad\\xff");
        assert_eq!(fe.display, "bad\\xfe");
        assert_eq!(ff.base64.as_deref(), Some("YmFk/w=="));
        assert_ne!(ff.base64, fe.base64);
        // A UTF-8 name spelled like the display form is told apart by the missing base64.
        let literal = RecordedName::new(b"bad\\xff");
        assert_eq!(literal.display, ff.display);
        assert_eq!(literal.base64, None);
    }

    #[test]
    fn invalid_bytes_inside_and_around_valid_sequences_round_trip() {
        // A truncated two-byte sequence, a lone continuation byte, an overlong encoding of '/',
        // and valid multi-byte characters between them.
        let raw: &[u8] = b"\xc3x\x80\xc0\xaf\xe2\x82\xac\xf0\x9f\x98";
        let name = RecordedName::new(raw);
        assert_eq!(name.display, "\\xc3x\\x80\\xc0\\xaf€\\xf0\\x9f\\x98");
        assert_eq!(
            raw_bytes(&name.display, name.base64.as_deref()).as_deref(),
            Some(raw)
        );
        assert_eq!(raw_bytes("plain", None).as_deref(), Some(&b"plain"[..]));
    }
}
