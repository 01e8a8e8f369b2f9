//! Host metrics as MCP clients see them, the idle score, and placement.
//!
//! The field names under `cpu`, `memory` and `gpu[]` are remote-sandbox-mcp's;
//! everything else is added beside them, so its users' prompts keep working.

use outpost_protocol::{GpuSource, HostMetrics, SlurmSummary};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize)]
pub struct Resources {
    pub cpu: CpuResources,
    pub memory: MemoryResources,
    /// Per-GPU usage; empty where the host has no NVIDIA GPU or the probe failed.
    pub gpu: Vec<GpuResources>,
    /// "nvml", "nvidia-smi", or "none".
    pub gpu_source: String,
    /// Set when a GPU driver is present but could not be read: GPU state unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskResources>,
    pub processes: u32,
    pub uptime_s: u64,
    /// 0 = fully busy, 1 = fully idle. See ARCHITECTURE.md for the formula.
    pub idle_score: f64,
    /// The cluster's partitions, when the host is a Slurm login node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmResources>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SlurmResources {
    pub partitions: Vec<PartitionResources>,
    /// Why `sinfo` gave nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PartitionResources {
    pub name: String,
    /// Where jobs without `--partition` go.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    pub up: bool,
    pub nodes: PartitionNodes,
    pub cpus: PartitionCpus,
    /// e.g. `gpu:a100:4`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub gres: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PartitionNodes {
    pub idle: u32,
    /// Allocated or mixed.
    pub allocated: u32,
    /// Down, drained, reserved…
    pub other: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct PartitionCpus {
    pub idle: u32,
    pub total: u32,
}

impl SlurmResources {
    /// The partition where an allocation of `gpus` GPUs on one node could
    /// start now: up, with an idle node whose GRES has that many GPUs. The
    /// default partition first, then the one with the most idle nodes.
    pub fn partition_for(&self, gpus: u32) -> Option<&PartitionResources> {
        self.partitions
            .iter()
            .filter(|p| p.up && p.nodes.idle > 0 && gpus_per_node(&p.gres) >= gpus)
            .max_by_key(|p| (p.default, p.nodes.idle))
    }

    fn from_summary(s: &SlurmSummary) -> SlurmResources {
        SlurmResources {
            partitions: s
                .partitions
                .iter()
                .map(|p| PartitionResources {
                    name: p.name.clone(),
                    default: p.default,
                    up: p.up,
                    nodes: PartitionNodes {
                        idle: p.nodes_idle,
                        allocated: p.nodes_allocated,
                        other: p.nodes_other,
                    },
                    cpus: PartitionCpus {
                        idle: p.cpus_idle,
                        total: p.cpus_total,
                    },
                    gres: p.gres.clone(),
                })
                .collect(),
            error: s.error.clone(),
        }
    }
}

/// GPUs per node in a GRES list as `sinfo` writes it: `gpu:4`,
/// `gpu:a100:4(S:0-1)`, `gpu:a100:2,gpu:v100:2`, `(null)`.
pub fn gpus_per_node(gres: &str) -> u32 {
    gres.split(',')
        .filter_map(|entry| {
            let entry = entry.split('(').next()?;
            let mut parts = entry.split(':');
            if parts.next()? != "gpu" {
                return None;
            }
            parts.next_back()?.parse::<u32>().ok()
        })
        .sum()
}

#[derive(Debug, Clone, Serialize)]
pub struct CpuResources {
    pub load_1m: f64,
    pub load_5m: f64,
    pub load_15m: f64,
    pub count: u32,
    /// CPU use over the last second, when sampled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryResources {
    pub total_mb: u64,
    pub used_mb: u64,
    pub free_mb: u64,
    pub used_pct: f64,
    pub swap_total_mb: u64,
    pub swap_used_mb: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuResources {
    pub index: u32,
    pub util_pct: f64,
    pub mem_used_mb: u64,
    pub mem_total_mb: u64,
    pub mem_used_pct: f64,
    pub name: String,
    pub uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
    /// The live lease holding this GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcessResources>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GpuProcessResources {
    pub pid: u32,
    pub user: String,
    pub command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_mb: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiskResources {
    /// "home" or "cwd".
    pub role: String,
    pub mount: String,
    pub total_gb: f64,
    pub free_gb: f64,
}

const MB: u64 = 1024 * 1024;
/// Commands are shown to agents; keep a host's listing compact.
const COMMAND_CHARS: usize = 80;

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        round1(part as f64 * 100.0 / whole as f64)
    }
}

impl Resources {
    pub fn from_metrics(m: &HostMetrics) -> Resources {
        let memory = MemoryResources {
            total_mb: m.mem_total_bytes / MB,
            used_mb: m.mem_used_bytes / MB,
            free_mb: m.mem_available_bytes / MB,
            used_pct: pct(m.mem_used_bytes, m.mem_total_bytes),
            swap_total_mb: m.swap_total_bytes / MB,
            swap_used_mb: m.swap_used_bytes / MB,
        };
        let cpu = CpuResources {
            load_1m: round2(m.load_1m),
            load_5m: round2(m.load_5m),
            load_15m: round2(m.load_15m),
            count: m.cpu_count,
            usage_pct: m.cpu_usage_pct.map(|p| round1(p as f64)),
        };
        let gpu: Vec<GpuResources> = m
            .gpu
            .gpus
            .iter()
            .map(|g| GpuResources {
                index: g.index,
                util_pct: g.util_pct.unwrap_or(0) as f64,
                mem_used_mb: g.mem_used_bytes / MB,
                mem_total_mb: g.mem_total_bytes / MB,
                mem_used_pct: pct(g.mem_used_bytes, g.mem_total_bytes),
                name: g.name.clone(),
                uuid: g.uuid.clone(),
                temperature_c: g.temperature_c,
                power_w: g.power_w.map(|w| round1(w as f64)),
                lease: g.lease.clone(),
                processes: g
                    .processes
                    .iter()
                    .map(|p| GpuProcessResources {
                        pid: p.pid,
                        user: p.user.clone(),
                        command: p.command.chars().take(COMMAND_CHARS).collect(),
                        mem_mb: p.mem_bytes.map(|b| b / MB),
                    })
                    .collect(),
            })
            .collect();
        let gpu_error = m.gpu.failed.then(|| {
            if m.gpu.problems.is_empty() {
                "GPU driver present but unreadable".to_string()
            } else {
                m.gpu.problems.join("; ")
            }
        });
        let idle_score = idle_score(&cpu, &memory, &gpu, m.gpu.failed);
        Resources {
            cpu,
            memory,
            gpu,
            gpu_source: match m.gpu.source {
                Some(GpuSource::Nvml) => "nvml",
                Some(GpuSource::NvidiaSmi) => "nvidia-smi",
                None => "none",
            }
            .into(),
            gpu_error,
            disks: m
                .disks
                .iter()
                .map(|d| DiskResources {
                    role: d.role.clone(),
                    mount: d.mount_point.clone(),
                    total_gb: round1(d.total_bytes as f64 / (1u64 << 30) as f64),
                    free_gb: round1(d.available_bytes as f64 / (1u64 << 30) as f64),
                })
                .collect(),
            processes: m.process_count,
            uptime_s: m.uptime_s,
            idle_score,
            slurm: m.slurm.as_ref().map(SlurmResources::from_summary),
        }
    }

    /// GPUs that are neither leased nor busy, with their free memory in MiB.
    fn free_gpus(&self) -> impl Iterator<Item = (&GpuResources, u64)> {
        self.gpu
            .iter()
            .filter(|g| g.lease.is_none())
            .map(|g| (g, g.mem_total_mb.saturating_sub(g.mem_used_mb)))
    }
}

/// remote-sandbox-mcp's weights (0.4 CPU, 0.4 memory, 0.2 GPU), with GPU
/// busyness the mean of utilisation and memory use. Hosts without GPUs are
/// scored 0.5 CPU + 0.5 memory instead of counting as GPU-idle; GPUs whose state
/// is unknown (driver present, probe failed) count as fully busy.
pub fn idle_score(
    cpu: &CpuResources,
    mem: &MemoryResources,
    gpus: &[GpuResources],
    gpu_failed: bool,
) -> f64 {
    let cpu_idle = if cpu.count > 0 {
        1.0 - (cpu.load_1m / cpu.count as f64).min(1.0)
    } else {
        0.0
    };
    let mem_idle = 1.0 - (mem.used_pct / 100.0).clamp(0.0, 1.0);
    let score = if gpu_failed {
        0.4 * cpu_idle + 0.4 * mem_idle
    } else if gpus.is_empty() {
        0.5 * cpu_idle + 0.5 * mem_idle
    } else {
        let n = gpus.len() as f64;
        let util = gpus.iter().map(|g| g.util_pct).sum::<f64>() / n / 100.0;
        let gmem = gpus.iter().map(|g| g.mem_used_pct).sum::<f64>() / n / 100.0;
        let gpu_idle = 1.0 - (0.5 * util + 0.5 * gmem).clamp(0.0, 1.0);
        0.4 * cpu_idle + 0.4 * mem_idle + 0.2 * gpu_idle
    };
    (score * 1000.0).round() / 1000.0
}

/// What `select_sandbox("auto")` must find on a host.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Requirements {
    /// GPUs that are unleased and have min_gpu_free_mb free each.
    pub min_gpus: Option<u32>,
    /// Free memory per GPU, MiB.
    pub min_gpu_free_mb: Option<u64>,
    /// Free host memory, MiB.
    pub min_free_mem_mb: Option<u64>,
    /// Highest acceptable 1-minute load per CPU (e.g. 0.5).
    pub max_load_per_cpu: Option<f64>,
}

impl Requirements {
    /// Why `r` does not fit, or None when it does.
    pub fn misfit(&self, r: &Resources) -> Option<String> {
        if let Some(need) = self.min_free_mem_mb
            && r.memory.free_mb < need
        {
            return Some(format!("{} MiB free memory < {need}", r.memory.free_mb));
        }
        if let Some(max) = self.max_load_per_cpu {
            let per_cpu = r.cpu.load_1m / r.cpu.count.max(1) as f64;
            if per_cpu > max {
                return Some(format!("load {per_cpu:.2}/CPU > {max}"));
            }
        }
        let gpu_mb = self.min_gpu_free_mb.unwrap_or(0);
        let need_gpus = self
            .min_gpus
            .unwrap_or(if self.min_gpu_free_mb.is_some() { 1 } else { 0 });
        if need_gpus > 0 {
            if let Some(e) = &r.gpu_error {
                return Some(format!("GPU state unknown: {e}"));
            }
            let fit = r.free_gpus().filter(|(_, free)| *free >= gpu_mb).count() as u32;
            if fit < need_gpus {
                return Some(format!(
                    "{fit} of {} GPUs unleased with ≥{gpu_mb} MiB free, need {need_gpus}",
                    r.gpu.len()
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(load: f64, used_pct: f64, gpus: Vec<(f64, f64)>, failed: bool) -> Resources {
        let cpu = CpuResources {
            load_1m: load,
            load_5m: 0.0,
            load_15m: 0.0,
            count: 4,
            usage_pct: None,
        };
        let memory = MemoryResources {
            total_mb: 1000,
            used_mb: (used_pct * 10.0) as u64,
            free_mb: 1000 - (used_pct * 10.0) as u64,
            used_pct,
            swap_total_mb: 0,
            swap_used_mb: 0,
        };
        let gpu: Vec<GpuResources> = gpus
            .into_iter()
            .enumerate()
            .map(|(i, (util, mem_pct))| GpuResources {
                index: i as u32,
                util_pct: util,
                mem_used_mb: (mem_pct * 800.0) as u64,
                mem_total_mb: 80_000,
                mem_used_pct: mem_pct,
                name: "GPU".into(),
                uuid: format!("GPU-{i}"),
                temperature_c: None,
                power_w: None,
                lease: None,
                processes: vec![],
            })
            .collect();
        let idle = idle_score(&cpu, &memory, &gpu, failed);
        Resources {
            cpu,
            memory,
            gpu,
            gpu_source: "nvml".into(),
            gpu_error: failed.then(|| "NVML: init failed".into()),
            disks: vec![],
            processes: 1,
            uptime_s: 1,
            idle_score: idle,
            slurm: None,
        }
    }

    #[test]
    fn idle_score_is_honest_about_gpus() {
        // No GPU: 0.5·0.75 + 0.5·0.5
        assert_eq!(res(1.0, 50.0, vec![], false).idle_score, 0.625);
        // A GPU with full memory is half busy even at 0 % utilisation.
        assert_eq!(res(1.0, 50.0, vec![(0.0, 100.0)], false).idle_score, 0.6);
        // Unknown GPU state scores as busy GPUs, below the idle-GPU host.
        let failed = res(1.0, 50.0, vec![], true).idle_score;
        assert_eq!(failed, 0.5);
        assert!(failed < res(1.0, 50.0, vec![(0.0, 0.0)], false).idle_score);
    }

    #[test]
    fn gres_lists_count_gpus_per_node() {
        assert_eq!(gpus_per_node("gpu:4"), 4);
        assert_eq!(gpus_per_node("gpu:a100:4(S:0-1)"), 4);
        assert_eq!(gpus_per_node("gpu:a100:2,gpu:v100:2"), 4);
        assert_eq!(gpus_per_node("gpu:a100:2(S:0),mps:100"), 2);
        for none in ["", "(null)", "mps:100", "gpu"] {
            assert_eq!(gpus_per_node(none), 0, "{none}");
        }
        let part = |name: &str, default: bool, idle: u32, gres: &str| PartitionResources {
            name: name.into(),
            default,
            up: true,
            nodes: PartitionNodes {
                idle,
                allocated: 0,
                other: 0,
            },
            cpus: PartitionCpus { idle: 8, total: 8 },
            gres: gres.into(),
        };
        let cluster = SlurmResources {
            partitions: vec![
                part("cpu", true, 9, ""),
                part("small", false, 3, "gpu:2"),
                part("big", false, 1, "gpu:a100:8"),
                part("busy", false, 0, "gpu:8"),
            ],
            error: None,
        };
        assert_eq!(cluster.partition_for(1).unwrap().name, "small");
        assert_eq!(cluster.partition_for(4).unwrap().name, "big");
        assert!(cluster.partition_for(9).is_none());
    }

    #[test]
    fn slurm_partitions_are_compact() {
        use outpost_protocol::SlurmPartition;
        let m = HostMetrics {
            slurm: Some(SlurmSummary {
                partitions: vec![
                    SlurmPartition {
                        name: "batch".into(),
                        default: true,
                        up: true,
                        nodes_idle: 2,
                        nodes_allocated: 1,
                        nodes_other: 0,
                        cpus_idle: 40,
                        cpus_total: 48,
                        gres: String::new(),
                    },
                    SlurmPartition {
                        name: "gpu".into(),
                        up: false,
                        nodes_other: 1,
                        cpus_total: 64,
                        gres: "gpu:a100:4".into(),
                        ..Default::default()
                    },
                ],
                error: None,
            }),
            ..Default::default()
        };
        let json = serde_json::to_value(Resources::from_metrics(&m)).unwrap();
        assert_eq!(
            json["slurm"],
            serde_json::json!({"partitions": [
                {"name": "batch", "default": true, "up": true,
                 "nodes": {"idle": 2, "allocated": 1, "other": 0},
                 "cpus": {"idle": 40, "total": 48}},
                {"name": "gpu", "up": false,
                 "nodes": {"idle": 0, "allocated": 0, "other": 1},
                 "cpus": {"idle": 0, "total": 64}, "gres": "gpu:a100:4"},
            ]})
        );
        let none = serde_json::to_value(Resources::from_metrics(&HostMetrics::default())).unwrap();
        assert!(none.get("slurm").is_none());
    }

    #[test]
    fn requirements_explain_misfits() {
        let r = res(3.0, 50.0, vec![(0.0, 90.0), (0.0, 10.0)], false);
        let fits = Requirements {
            min_gpus: Some(1),
            min_gpu_free_mb: Some(40_000),
            ..Default::default()
        };
        assert_eq!(fits.misfit(&r), None);
        let two = Requirements {
            min_gpus: Some(2),
            min_gpu_free_mb: Some(40_000),
            ..Default::default()
        };
        assert!(two.misfit(&r).unwrap().contains("1 of 2 GPUs"));
        let load = Requirements {
            max_load_per_cpu: Some(0.5),
            ..Default::default()
        };
        assert!(load.misfit(&r).unwrap().contains("load"));
        let failed = res(0.0, 10.0, vec![], true);
        assert!(fits.misfit(&failed).unwrap().contains("unknown"));
    }
}
