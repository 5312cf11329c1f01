//! Writing a file so that it costs its data, not its length: every block of zeros becomes a
//! hole. The record keeps a file's contents, not its layout, so what is written back out from
//! it (a fork's base, a rewind, an archive upload, the spool of a download) would otherwise
//! allocate every zero a sparse file only claimed — `truncate -s 9M` six times made a 54 MiB
//! fork base from a workspace of a few kilobytes, outside every quota. A hole reads as the
//! zeros it stands for, so the file's contents (and hash) are exactly the same; it simply never
//! takes more disk than the file's non-zero blocks, which is at most what the source did.
//!
//! The writer must start with an empty file: a block it skips is left as it was (a hole only in
//! a file that had nothing there). Blocks are [`BLOCK`] bytes at offsets that are multiples of
//! it (the page size, and the block size of ext4 and XFS); a block that is not all zeros is
//! written whole with `pwrite`, and the length is set at the end (`ftruncate`), which makes a
//! trailing run of zeros a hole too.
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;

/// Size of a block that becomes a hole when it is all zeros.
pub const BLOCK: usize = 4096;
/// Bytes gathered before they are written: one system call per this many at most.
const BUFFER: usize = 64 * BLOCK;

/// A [`Write`] into an empty file that leaves blocks of zeros as holes; [`SparseWriter::finish`]
/// sets the length. Memory: one 256 KiB buffer.
pub struct SparseWriter<F: FileExt> {
    file: F,
    /// File offset of `buf[0]`: always a multiple of [`BUFFER`].
    base: u64,
    buf: Vec<u8>,
}

impl<F: FileExt> SparseWriter<F> {
    pub fn new(file: F) -> Self {
        Self {
            file,
            base: 0,
            buf: Vec::with_capacity(BUFFER),
        }
    }

    /// Bytes written so far (the file's length once finished).
    pub fn len(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes out the buffered blocks that hold data.
    fn flush_blocks(&mut self) -> io::Result<()> {
        let mut at = 0;
        while at < self.buf.len() {
            let end = (at + BLOCK).min(self.buf.len());
            let block = &self.buf[at..end];
            if block.iter().any(|b| *b != 0) {
                // Runs of data blocks in one call.
                let mut run_end = end;
                while run_end < self.buf.len() {
                    let next = (run_end + BLOCK).min(self.buf.len());
                    if self.buf[run_end..next].iter().all(|b| *b == 0) {
                        break;
                    }
                    run_end = next;
                }
                self.file
                    .write_all_at(&self.buf[at..run_end], self.base + at as u64)?;
                at = run_end;
            } else {
                at = end;
            }
        }
        self.base += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Copies everything `reader` holds (at most `limit` bytes); how many.
    pub fn copy_from(&mut self, reader: &mut dyn Read, limit: u64) -> io::Result<u64> {
        let mut copied = 0u64;
        while copied < limit {
            let room = BUFFER - self.buf.len();
            let want = usize::try_from(limit - copied).map_or(room, |l| l.min(room));
            let start = self.buf.len();
            self.buf.resize(start + want, 0);
            let n = loop {
                match reader.read(&mut self.buf[start..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.buf.truncate(start);
                        return Err(e);
                    }
                }
            };
            self.buf.truncate(start + n);
            if n == 0 {
                break;
            }
            copied += n as u64;
            if self.buf.len() == BUFFER {
                self.flush_blocks()?;
            }
        }
        Ok(copied)
    }
}

impl SparseWriter<File> {
    /// Writes what is buffered and sets the file's length; the file.
    pub fn finish(mut self) -> io::Result<File> {
        let len = self.len();
        self.flush_blocks()?;
        self.file.set_len(len)?;
        Ok(self.file)
    }
}

impl<F: FileExt> Write for SparseWriter<F> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = BUFFER - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == BUFFER {
            self.flush_blocks()?;
        }
        Ok(n)
    }

    /// Blocks already complete are written; the partial one waits for [`SparseWriter::finish`]
    /// (a block is only known to be zeros once it is whole).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests look at the result on the host"
)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn written(chunks: &[&[u8]]) -> (Vec<u8>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut w = SparseWriter::new(File::create(&path).unwrap());
        for c in chunks {
            w.write_all(c).unwrap();
        }
        w.finish().unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        (std::fs::read(&path).unwrap(), meta.blocks() * 512)
    }

    #[test]
    fn zeros_become_holes_and_the_contents_are_the_same() {
        let zeros = vec![0u8; 8 << 20];
        let (bytes, used) = written(&[b"head", &zeros, b"tail"]);
        assert_eq!(bytes.len(), 8 + (8 << 20));
        assert_eq!(&bytes[..4], b"head");
        assert_eq!(&bytes[bytes.len() - 4..], b"tail");
        assert!(bytes[4..bytes.len() - 4].iter().all(|b| *b == 0));
        assert!(used <= 16 * 1024, "{used} bytes allocated");
        // Trailing zeros: a hole up to the length.
        let (bytes, used) = written(&[b"x", &zeros]);
        assert_eq!(bytes.len(), 1 + (8 << 20));
        assert!(used <= 8 * 1024, "{used} bytes allocated");
        // Nothing but zeros: no block at all.
        let (bytes, used) = written(&[&zeros]);
        assert_eq!(bytes.len(), 8 << 20);
        assert_eq!(used, 0);
    }

    #[test]
    fn data_in_odd_sized_writes_comes_back_exactly() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let chunks: Vec<&[u8]> = data.chunks(4093).collect();
        let (bytes, used) = written(&chunks);
        assert_eq!(bytes, data);
        assert!(used >= data.len() as u64);
        let (bytes, _) = written(&[]);
        assert!(bytes.is_empty());
    }

    #[test]
    fn a_copy_stops_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut w = SparseWriter::new(File::create(&path).unwrap());
        let source = vec![5u8; 1 << 20];
        assert_eq!(w.copy_from(&mut &source[..], 1000).unwrap(), 1000);
        assert_eq!(w.copy_from(&mut &source[..0], 10).unwrap(), 0);
        w.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![5u8; 1000]);
    }
}
