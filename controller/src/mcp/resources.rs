//! The MCP resources: `sandbox://list` (the sandboxes and the active one)
//! and `sandbox://{name}/status` (connection, CPU, memory, disks and GPUs of
//! one sandbox), as `read` answers them; `mod.rs` lists them.

use rmcp::ErrorData as McpError;

use super::sandboxes::ListResult;
use super::{LIST_URI, OutpostServer, RESOURCE_DEADLINE_EXTRA};
use crate::fleet::Fleet;

impl OutpostServer {
    pub(super) async fn read(&self, uri: &str) -> Result<serde_json::Value, McpError> {
        let deadline = self.fleet.config.connect_timeout + RESOURCE_DEADLINE_EXTRA;
        let value = if uri == LIST_URI {
            serde_json::to_value(ListResult {
                active_sandbox: self.fleet.active_name(),
                sandboxes: crate::ops::sandboxes::hosts(&self.fleet, false, deadline).await,
            })
        } else if let Some(name) = uri
            .strip_prefix("sandbox://")
            .and_then(|rest| rest.strip_suffix("/status"))
        {
            let session = self
                .fleet
                .get(Some(name))
                .map_err(|e| McpError::resource_not_found(e, None))?;
            let (host, port, user) = session.config.address();
            let status = match Fleet::resources(&session, deadline).await {
                Ok(r) => serde_json::json!({
                    "name": name, "host": host, "port": port, "user": user,
                    "connection_alive": true, "resources": r,
                }),
                Err(e) => serde_json::json!({
                    "name": name, "host": host, "port": port, "user": user,
                    "connection_alive": false, "connection_error": e,
                }),
            };
            Ok(status)
        } else {
            return Err(McpError::resource_not_found(
                format!("unknown resource {uri}; try {LIST_URI} or sandbox://NAME/status"),
                None,
            ));
        };
        value.map_err(|e| McpError::internal_error(e.to_string(), None))
    }
}
