//! A `multipart/form-data` body read whole (it is bounded by the request's body limit): the
//! fields of `upload`, as the client's aiohttp `FormData` sends them. Parsed on the blocking
//! pool (see `upload`): a body of the whole limit takes milliseconds, not an async worker's turn.

/// One part: its field name, its file name (for a file), its bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Part<'a> {
    pub name: String,
    pub filename: Option<String>,
    pub data: &'a [u8],
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut it = content_type.split(';');
    if !it
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    it.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
    .filter(|b| !b.is_empty() && b.len() <= 200)
}

/// Where `needle` is in `hay` at or after `from`: linear in the length of `hay` whatever it
/// holds (a body made of near-boundaries costs no more than any other), unlike a naive search.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    memchr::memmem::find(hay.get(from..)?, needle).map(|p| p + from)
}

/// A `name="value"` parameter of a Content-Disposition header.
fn param(header: &str, key: &str) -> Option<String> {
    header.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(key)
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The parts of `body`, or why it is not multipart.
pub fn parts<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, String> {
    let delim = format!("--{boundary}").into_bytes();
    let next_delim = format!("\r\n--{boundary}").into_bytes();
    let mut at = find(body, &delim, 0).ok_or("no multipart boundary in the body")? + delim.len();
    let mut out = Vec::new();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(out);
        }
        if body.get(at..at + 2) != Some(b"\r\n") {
            return Err("a multipart boundary is not followed by CRLF".into());
        }
        at += 2;
        let head_end = find(body, b"\r\n\r\n", at).ok_or("a part has no end of headers")?;
        let head = std::str::from_utf8(&body[at..head_end])
            .map_err(|_| "a part's headers are not UTF-8")?;
        let disposition = head
            .split("\r\n")
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then_some(v)
            })
            .ok_or("a part has no Content-Disposition")?;
        let name = param(disposition, "name").ok_or("a part has no name")?;
        let filename = param(disposition, "filename");
        let data_at = head_end + 4;
        let end = find(body, &next_delim, data_at).ok_or("a part has no closing boundary")?;
        out.push(Part {
            name,
            filename,
            data: &body[data_at..end],
        });
        at = end + next_delim.len();
        if out.len() > 16 {
            return Err("too many parts".into());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fields_and_files_are_read() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\r\n--X\r\n--XyZ\r\nContent-Disposition: form-data; name=\"unzip\"\r\n\r\ntrue\r\n--XyZ--\r\n";
        let b = boundary("multipart/form-data; boundary=XyZ").unwrap();
        let p = parts(body, &b).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].name, "file");
        assert_eq!(p[0].filename.as_deref(), Some("a.bin"));
        assert_eq!(p[0].data, b"\x00\r\n--X");
        assert_eq!(p[1].data, b"true");
        assert!(boundary("application/json").is_none());
        assert!(parts(b"garbage", "XyZ").is_err());
    }
}
