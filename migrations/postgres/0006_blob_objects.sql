-- Blobs kept in S3-compatible object storage (`blobs.backend = "s3"`, docs/operator.md): a row
-- says that the blob with this hash is the object `<blobs.s3_prefix><sha256>` of the configured
-- bucket, and not a row of `blobs`. The object is written first, then this row, then the event
-- that names the blob: a crash in between leaves an object (or a row) nothing names, never an
-- event that names nothing (docs/design.md, "Blobs in object storage").
CREATE TABLE blob_objects (
    sha256     text        PRIMARY KEY,
    size       bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
