//! A TCP listener that can refuse connections for a while, for real: it
//! closes its socket (clients get "connection refused") and binds the same
//! address again afterwards. Its connections can be cut by the handler
//! serving them: the provider that executes a request, then drops the
//! connection without answering.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Shared switch: "refuse until".
#[derive(Debug, Clone, Default)]
pub struct RefuseSwitch {
    until: Arc<Mutex<Option<Instant>>>,
    changed: Arc<Notify>,
}

impl RefuseSwitch {
    pub fn refuse_for(&self, period: Duration) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + period);
        self.changed.notify_waiters();
    }

    fn take(&self) -> Option<Instant> {
        self.until.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

pub struct RefusableListener {
    inner: Option<TcpListener>,
    addr: SocketAddr,
    switch: RefuseSwitch,
}

impl RefusableListener {
    pub fn new(inner: TcpListener, switch: RefuseSwitch) -> io::Result<RefusableListener> {
        let addr = inner.local_addr()?;
        Ok(RefusableListener { inner: Some(inner), addr, switch })
    }

    async fn refuse_until(&mut self, until: Instant) {
        self.inner = None;
        tokio::time::sleep_until(until).await;
        loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => {
                    self.inner = Some(listener);
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

impl axum::serve::Listener for RefusableListener {
    type Io = CuttableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CuttableStream, SocketAddr) {
        loop {
            if let Some(until) = self.switch.take() {
                self.refuse_until(until).await;
            }
            let Some(listener) = &self.inner else { continue };
            let changed = self.switch.changed.clone();
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => return (CuttableStream { inner: stream, cut: ConnCut::default() }, peer),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                },
                () = changed.notified() => {}
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// A handle on one connection, as connect info for its handlers: once cut,
/// the connection fails its next write and hyper closes it, so the client
/// sees the connection end without an answer.
#[derive(Debug, Clone, Default)]
pub struct ConnCut(Arc<AtomicBool>);

impl ConnCut {
    pub fn cut(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_cut(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, RefusableListener>> for ConnCut {
    fn connect_info(stream: IncomingStream<'_, RefusableListener>) -> ConnCut {
        stream.io().cut.clone()
    }
}

/// A TCP stream whose writes fail once its [`ConnCut`] is cut.
pub struct CuttableStream {
    inner: TcpStream,
    cut: ConnCut,
}

fn cut_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "connection cut by the simulator")
}

impl AsyncRead for CuttableStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.cut.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CuttableStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.cut.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if self.cut.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
