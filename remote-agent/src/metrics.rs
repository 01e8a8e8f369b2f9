//! Host resource snapshots for `Request::Metrics`.
//!
//! One `sysinfo::System` lives for the whole session: its CPU list is read once
//! and memory is refreshed per request, which keeps each snapshot cheap.

use outpost_protocol::HostMetrics;
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, System};

pub struct Sampler {
    system: System,
    cpu_count: u32,
}

impl Sampler {
    pub fn new() -> Result<Sampler, String> {
        let mut system = System::new().map_err(|e| format!("cannot read host info: {e}"))?;
        system.refresh_cpu_list(CpuRefreshKind::nothing());
        let mut cpu_count = system.cpus().len() as u32;
        if cpu_count == 0 {
            cpu_count = std::thread::available_parallelism().map_or(0, |n| n.get() as u32);
        }
        Ok(Sampler { system, cpu_count })
    }

    pub fn sample(&mut self) -> HostMetrics {
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram().with_swap());
        let load = System::load_average().ok();
        let total = self.system.total_memory();
        let available = self.system.available_memory();
        HostMetrics {
            cpu_count: self.cpu_count,
            load_1m: load.as_ref().map_or(0.0, |l| l.one),
            load_5m: load.as_ref().map_or(0.0, |l| l.five),
            load_15m: load.as_ref().map_or(0.0, |l| l.fifteen),
            mem_total_bytes: total,
            mem_used_bytes: total.saturating_sub(available),
            mem_available_bytes: available,
            swap_total_bytes: self.system.total_swap(),
            swap_used_bytes: self.system.used_swap(),
            uptime_s: System::uptime().unwrap_or(0),
        }
    }

    /// CPU model name, for `diagnose`.
    pub fn cpu_brand(&self) -> Option<String> {
        self.system
            .cpus()
            .first()
            .map(|c| c.brand().trim().to_string())
            .filter(|b| !b.is_empty())
    }
}
