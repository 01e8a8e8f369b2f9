//! `expose_port`: a sandbox's port served at `http://127.0.0.1:LOCAL` on
//! this machine.
//!
//! The host's agent serves the port on a unix socket for as long as the
//! sandbox lives (`SandboxExpose`, its keeper relaying each connection into
//! the sandbox's own network namespace). Here, each local connection opens
//! a stream to that socket over the host's live connection (SSH
//! `direct-streamlocal`, or directly on the local host), made again if it
//! dropped, so a reconnect brings the forward back with the next
//! connection. Bytes pass as they are: HTTP, WebSockets, anything on TCP.
//! `delete_sandbox` closes it; once the sandbox has ended, connections
//! close at once.

use std::sync::Arc;

use outpost_protocol::{Request, Response};
use tokio::net::{TcpListener, TcpStream};

use super::jobs::{ask, unexpected};
use crate::fleet::{Fleet, Forward};
use crate::session::Session;

/// The URL that serves `port` of the isolated sandbox `name`, made on the
/// first call and the same on later ones.
pub async fn expose(fleet: &Fleet, name: &str, port: u16) -> Result<String, String> {
    if port == 0 {
        return Err("port must be 1 to 65535".into());
    }
    if let Some(url) = fleet.forward_url(name, port) {
        return Ok(url);
    }
    let (host, id) = fleet.isolated(name)?;
    if host.config.slurm.is_some() {
        return Err(format!(
            "{name} is a Slurm allocation: its ports are not exposed"
        ));
    }
    let socket = match ask(&host, Request::SandboxExpose { id, port })
        .await
        .map_err(|e| e.to_string())?
    {
        Response::Exposed { socket } => socket,
        other => return Err(unexpected("exposing a port", other).to_string()),
    };
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let url = format!("http://127.0.0.1:{}", local.port());
    let accepting = tokio::spawn(accept(listener, host, socket)).abort_handle();
    fleet.add_forward(
        name,
        Forward {
            port,
            url: url.clone(),
            accepting,
        },
    );
    Ok(url)
}

async fn accept(listener: TcpListener, host: Arc<Session>, socket: String) {
    loop {
        let Ok((local, _)) = listener.accept().await else {
            continue;
        };
        let _ = local.set_nodelay(true);
        tokio::spawn(carry(local, host.clone(), socket.clone()));
    }
}

/// One connection, both ways until both ends are done.
async fn carry(mut local: TcpStream, host: Arc<Session>, socket: String) {
    match host.open_socket(&socket).await {
        Ok(mut remote) => {
            let _ = tokio::io::copy_bidirectional(&mut local, &mut remote).await;
        }
        Err(e) => tracing::info!("a connection to {socket} failed: {e}"),
    }
}
