//! A TCP proxy on loopback that a test can cut and heal: how a process is cut
//! off from one peer (its database) while it keeps the others (its broker),
//! with real sockets and no change to the process under test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Forwards every connection made to [`CutProxy::addr`] to `target`.
pub struct CutProxy {
    addr: SocketAddr,
    /// `true` while cut: open connections are dropped and new ones closed
    /// at once, so both ends see their connection fail.
    cut: Arc<watch::Sender<bool>>,
    refused: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl CutProxy {
    pub async fn start(target: SocketAddr) -> anyhow::Result<CutProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let stop = CancellationToken::new();
        let refused = Arc::new(AtomicU64::new(0));
        tokio::spawn(accept_loop(listener, target, cut.clone(), refused.clone(), stop.clone()));
        Ok(CutProxy { addr, cut, refused, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every open connection and refuses new ones until [`heal`].
    ///
    /// [`heal`]: CutProxy::heal
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Connections closed at once because the proxy was cut: proof that the
    /// process under test tried to reach its peer during the cut.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    refused: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((client, _)) = accepted else { continue };
        if *cut.borrow() {
            drop(client);
            refused.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        tokio::spawn(forward(client, target, cut.subscribe(), stop.clone()));
    }
}

async fn forward(mut client: TcpStream, target: SocketAddr, mut cut: watch::Receiver<bool>, stop: CancellationToken) {
    let Ok(mut server) = TcpStream::connect(target).await else { return };
    // Biased: once cut, no further byte gets through, even one already
    // waiting on either socket.
    tokio::select! {
        biased;
        _ = stop.cancelled() => {}
        _ = cut.wait_for(|cut| *cut) => {}
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn echo_server() -> anyhow::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(addr)
    }

    async fn round_trip(stream: &mut TcpStream) -> anyhow::Result<bool> {
        if stream.write_all(b"ping").await.is_err() {
            return Ok(false);
        }
        let mut buf = [0u8; 4];
        Ok(stream.read_exact(&mut buf).await.is_ok() && &buf == b"ping")
    }

    #[tokio::test]
    async fn a_cut_drops_open_connections_and_refuses_new_ones_until_healed() -> anyhow::Result<()> {
        let proxy = CutProxy::start(echo_server().await?).await?;
        let mut open = TcpStream::connect(proxy.addr()).await?;
        assert!(round_trip(&mut open).await?, "forwards while healed");

        proxy.cut();
        assert!(!round_trip(&mut open).await?, "the open connection is gone");
        let mut new = TcpStream::connect(proxy.addr()).await?;
        assert!(!round_trip(&mut new).await?, "a new connection gets nowhere");
        assert_eq!(proxy.refused(), 1);

        proxy.heal();
        let mut again = TcpStream::connect(proxy.addr()).await?;
        assert!(round_trip(&mut again).await?, "forwards again once healed");
        Ok(())
    }
}
