//! Installing the agent over SFTP.

use std::path::Path;

use russh_sftp::client::SftpSession;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Upload through SFTP: temp name in the target directory, mode 0700, then rename
/// (after removing a corrupt file, since SFTP rename does not overwrite).
pub(super) async fn upload(
    sftp: &SftpSession,
    local: &Path,
    dirs: &[String],
    agent_path: &str,
) -> Result<(), String> {
    // Streamed, not read whole: a fleet installing at once would hold one
    // copy of the agent per host.
    let mut source = tokio::fs::File::open(local)
        .await
        .map_err(|e| format!("cannot read {}: {e}", local.display()))?;
    for dir in dirs {
        if !sftp.try_exists(dir.clone()).await.unwrap_or(false) {
            match sftp.create_dir(dir.clone()).await {
                Ok(()) => {
                    let mut attrs = russh_sftp::protocol::FileAttributes::empty();
                    attrs.permissions = Some(0o700);
                    let _ = sftp.set_metadata(dir.clone(), attrs).await;
                }
                // Another controller may have created it meanwhile.
                Err(e) if !sftp.try_exists(dir.clone()).await.unwrap_or(false) => {
                    return Err(format!("cannot create {dir}: {e}"));
                }
                Err(_) => {}
            }
        }
    }
    let parent = agent_path.rsplit_once('/').map_or(".", |(dir, _)| dir);
    let tmp = format!(
        "{parent}/.outpost-agent.{}.{}.tmp",
        std::process::id(),
        rand_suffix()
    );
    let mut file = sftp
        .create(tmp.clone())
        .await
        .map_err(|e| format!("cannot create {tmp}: {e}"))?;
    let write = async {
        let mut chunk = vec![0u8; 256 * 1024];
        loop {
            let n = source.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            file.write_all(&chunk[..n]).await?;
        }
        file.shutdown().await
    };
    if let Err(e) = write.await {
        let _ = sftp.remove_file(tmp.clone()).await;
        return Err(format!("writing {tmp}: {e}"));
    }
    let mut attrs = russh_sftp::protocol::FileAttributes::empty();
    attrs.permissions = Some(crate::host::AGENT_MODE);
    sftp.set_metadata(tmp.clone(), attrs)
        .await
        .map_err(|e| format!("chmod {tmp}: {e}"))?;
    let _ = sftp.remove_file(agent_path.to_string()).await;
    if let Err(e) = sftp.rename(tmp.clone(), agent_path.to_string()).await {
        let _ = sftp.remove_file(tmp.clone()).await;
        // A concurrent controller may have won the race with the same content.
        if !sftp
            .try_exists(agent_path.to_string())
            .await
            .unwrap_or(false)
        {
            return Err(format!("rename to {agent_path}: {e}"));
        }
    }
    Ok(())
}

fn rand_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{nanos:08x}")
}
