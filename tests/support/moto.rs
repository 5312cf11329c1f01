//! A real S3-compatible server for the object-storage tests: `moto_server` (moto in server
//! mode, from PyPI; `.ci/run` installs it) started on a free loopback port, with a bucket, and
//! killed when dropped. The test fails — never skips — when it cannot be started.
//! Test-only code: panicking on a failed setup is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::ObjectStore;
use toolexec_store::objects::BlobsConfig;

/// How long moto may take to answer after it is started (it imports every AWS service's
/// models first: a few seconds on a busy machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The bucket the tests' services write to.
pub const BUCKET: &str = "toolexec-test-blobs";

/// Credentials moto accepts (it checks none).
pub const ACCESS_KEY: &str = "toolexec-test-key";
pub const SECRET_KEY: &str = "toolexec-test-secret";

/// `$TOOLEXEC_TEST_MOTO_SERVER`, else `moto_server` from `PATH`.
fn moto_server() -> String {
    std::env::var("TOOLEXEC_TEST_MOTO_SERVER").unwrap_or_else(|_| "moto_server".into())
}

pub struct Moto {
    child: Option<Child>,
    pub port: u16,
}

impl Moto {
    /// Starts moto on a free port and creates [`BUCKET`].
    pub async fn start() -> Moto {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("local addr").port()
        };
        let mut moto = Moto { child: None, port };
        moto.up().await;
        moto
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again, on the same port: moto keeps nothing, so the bucket is made
    /// anew) and waits until it answers.
    pub async fn up(&mut self) {
        assert!(self.child.is_none(), "moto is already running");
        let child = Command::new(moto_server())
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}): the object-storage tests need moto in server mode \
                     (`pip install 'moto[server]'`, as .ci/run does; or point \
                     TOOLEXEC_TEST_MOTO_SERVER at its moto_server)",
                    moto_server()
                )
            });
        // Owned by `self` from here on, so that a panic below still kills it (Drop).
        self.child = Some(child);
        toolexec_tools::web::install_tls_provider();
        let http = reqwest::Client::new();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("moto_server exited at start: {status}");
            }
            if http
                .get(format!("{}/", self.endpoint()))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer within {START_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let created = http
            .put(format!("{}/{BUCKET}", self.endpoint()))
            .send()
            .await
            .expect("creating the bucket");
        assert!(
            created.status().is_success(),
            "creating the bucket: {}",
            created.status()
        );
    }

    /// Kills the server (the object store is down) and waits until its port refuses.
    pub async fn down(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "moto still answers after kill");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The `blobs.*` settings of a service that keeps blobs above `inline_max_bytes` here.
    pub fn config(&self, prefix: &str, inline_max_bytes: usize) -> BlobsConfig {
        BlobsConfig {
            backend: "s3".into(),
            inline_max_bytes,
            s3_endpoint: Some(self.endpoint()),
            s3_bucket: Some(BUCKET.into()),
            s3_region: Some("us-east-1".into()),
            s3_prefix: prefix.into(),
            s3_allow_http: true,
            s3_access_key_id: Some(ACCESS_KEY.into()),
            s3_secret_access_key: Some(SECRET_KEY.into()),
            s3_session_token: None,
        }
    }

    /// The keys of the bucket, through the S3 API (ListObjectsV2).
    pub async fn keys(&self) -> Vec<String> {
        let s3: Arc<dyn ObjectStore> = self.config("", 0).s3().expect("an S3 client");
        let mut keys: Vec<String> = s3
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .expect("listing the bucket");
        keys.sort();
        keys
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
