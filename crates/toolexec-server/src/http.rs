//! Serving the HTTP app: an accept loop over hyper's HTTP/1 server instead of `axum::serve`,
//! for the bounds `axum::serve` does not expose — a client that opens connections and never
//! finishes its headers must not hold them forever, and there is a cap on open connections.
//!
//! - `header_read_timeout`: a request's head must arrive within it (else the connection is
//!   closed); this also ends idle keep-alive connections that never send another request;
//! - `max_connections`: beyond it a new connection is accepted and closed at once (the kernel
//!   backlog would otherwise hold it, unanswered);
//! - the body's own deadline and size are the app's (`toolexec_api::limits::guard_body`);
//! - graceful shutdown: stop accepting, let in-flight requests finish.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How the server holds connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for in-flight requests.
pub async fn serve_app(
    app: Router,
    listener: TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, a connection reset before accept: keep serving the
                    // connections there are, and try again shortly.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = limits.max_connections, "connection refused: at max_connections");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .keep_alive(true);
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
