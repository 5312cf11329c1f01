//! A layer's compression, from its media type (none, gzip, zstd), and a zstd reader that reads
//! every frame of a layer (a layer may be several frames one after another).
use std::io;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

/// A zstd stream of one or more frames (skippable frames skipped, as `zstd:chunked` layers
/// have), decoded as it is read. Each frame's window is at most ruzstd's 128 MiB default: a
/// frame asking for more is refused, which bounds the memory one layer's decoding takes.
pub(crate) struct ZstdFrames<R: io::BufRead> {
    source: R,
    decoder: ruzstd::decoding::FrameDecoder,
    in_frame: bool,
}

impl<R: io::BufRead> ZstdFrames<R> {
    pub(crate) fn new(source: R) -> Self {
        Self {
            source,
            decoder: ruzstd::decoding::FrameDecoder::new(),
            in_frame: false,
        }
    }
}

impl<R: io::BufRead> io::Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if self.source.fill_buf()?.is_empty() {
                    return Ok(0);
                }
                match self.decoder.reset(&mut self.source) {
                    Ok(()) => self.in_frame = true,
                    Err(FrameDecoderError::ReadFrameHeaderError(
                        ReadFrameHeaderError::SkipFrame { length, .. },
                    )) => {
                        let skipped = io::copy(
                            &mut (&mut self.source).take(u64::from(length)),
                            &mut io::sink(),
                        )?;
                        if skipped != u64::from(length) {
                            return Err(io::Error::other("a zstd skippable frame is cut short"));
                        }
                        continue;
                    }
                    Err(e) => return Err(io::Error::other(format!("zstd: {e}"))),
                }
            }
            let d = &mut self.decoder;
            while d.can_collect() == 0 && !d.is_finished() {
                d.decode_blocks(
                    &mut self.source,
                    ruzstd::decoding::BlockDecodingStrategy::UptoBlocks(1),
                )
                .map_err(|e| io::Error::other(format!("zstd: {e}")))?;
            }
            let n = d.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if d.is_finished() && d.can_collect() == 0 {
                self.in_frame = false;
            }
        }
    }
}

pub(crate) fn compression(media_type: &str) -> Result<Compression, String> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd" => Ok(Compression::Zstd),
        other => Err(format!("a layer of media type '{other}' is not supported")),
    }
}
