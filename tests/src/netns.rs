//! [`Netns`]: a network namespace joined by a veth pair, a test host whose
//! link a test can slow or cut.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::SETUP_HINT;

/// A network namespace joined to this one by a veth pair: a test host with an
/// address of its own whose link a test can cut. Only link-local addresses
/// (169.254.0.0/16) on the pair are used; traffic never leaves the machine.
pub struct Netns {
    pub(crate) name: String,
    host_veth: String,
    ns_veth: String,
    pub(crate) ns_addr: String,
}

static NETNS_SEQ: AtomicU64 = AtomicU64::new(0);

impl Netns {
    /// Creates the namespace, the veth pair and their addresses; panics with
    /// the failing command's output (creating namespaces needs root).
    pub fn new() -> Netns {
        // Interface names are limited to 15 bytes; pid and sequence keep
        // concurrent test processes apart.
        let seq = NETNS_SEQ.fetch_add(1, Ordering::Relaxed);
        let id = (std::process::id() as u64 % 4096) * 16 + seq % 16;
        let name = format!("outpost-t{id}");
        let host_veth = format!("opv{id}a");
        let ns_veth = format!("opv{id}b");
        // A /30 per namespace inside 169.254.0.0/16, from the id.
        let block = (id % 16_000) * 4;
        let (b3, b4) = ((block / 256) % 256, block % 256);
        let host_addr = format!("169.254.{b3}.{}", b4 + 1);
        let ns_addr = format!("169.254.{b3}.{}", b4 + 2);
        let netns = Netns {
            name: name.clone(),
            host_veth: host_veth.clone(),
            ns_veth: ns_veth.clone(),
            ns_addr: ns_addr.clone(),
        };
        // Leftovers from a crashed run with the same id would make `add` fail.
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &host_veth])
            .output();
        run_ip(&["netns", "add", &name]);
        run_ip(&[
            "link", "add", &host_veth, "type", "veth", "peer", "name", &ns_veth,
        ]);
        run_ip(&["link", "set", &ns_veth, "netns", &name]);
        run_ip(&["addr", "add", &format!("{host_addr}/30"), "dev", &host_veth]);
        run_ip(&["link", "set", &host_veth, "up"]);
        let in_ns = |args: &[&str]| {
            let mut full = vec!["netns", "exec", &name, "ip"];
            full.extend_from_slice(args);
            run_ip(&full);
        };
        in_ns(&["addr", "add", &format!("{ns_addr}/30"), "dev", &ns_veth]);
        in_ns(&["link", "set", &ns_veth, "up"]);
        in_ns(&["link", "set", "lo", "up"]);
        netns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Slows traffic into the namespace (the controller's uplink to a host
    /// inside it) to `kbit` kilobits per second, as a slow VPN or a home
    /// uplink would.
    pub fn limit_uplink(&self, kbit: u32) {
        let rate = format!("{kbit}kbit");
        self.qdisc(&["add", "dev", &self.host_veth, "root", "tbf", "rate", &rate])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Lifts [`Netns::limit_uplink`]'s limit.
    pub fn unlimit_uplink(&self) {
        self.qdisc(&["del", "dev", &self.host_veth, "root"])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `tc qdisc ARGS…` (a token bucket's burst and latency added to an
    /// `add`), or why it failed.
    fn qdisc(&self, args: &[&str]) -> Result<(), String> {
        let mut cmd = Command::new("tc");
        cmd.arg("qdisc").args(args);
        if args.first() == Some(&"add") {
            cmd.args(["burst", "16kb", "latency", "2s"]);
        }
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run tc: {e}; {SETUP_HINT}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!(
                "tc failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }

    /// Cuts the link: packets to and from the namespace are dropped silently,
    /// as when a cable is pulled or a switch dies.
    pub fn cut(&self) {
        run_ip(&[
            "netns", "exec", &self.name, "ip", "link", "set", "lo", "down",
        ]);
        run_ip(&[
            "netns",
            "exec",
            &self.name,
            "ip",
            "link",
            "set",
            &self.ns_veth,
            "down",
        ]);
    }
}

impl Default for Netns {
    fn default() -> Self {
        Netns::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .output();
    }
}

fn run_ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip: {e}; {SETUP_HINT}"));
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
