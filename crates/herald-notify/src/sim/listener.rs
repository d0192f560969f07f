//! A TCP listener that can refuse connections for a while, for real: it
//! closes its socket (clients get "connection refused") and binds the same
//! address again afterwards.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if let Some(until) = self.switch.take() {
                self.refuse_until(until).await;
            }
            let Some(listener) = &self.inner else { continue };
            let changed = self.switch.changed.clone();
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(conn) => return conn,
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
