//! Every message round-trips through a frame; hostile input never panics.

use outpost_protocol::limits::MAX_FRAME_LEN;
use outpost_protocol::*;

fn sample_messages() -> (Hello, Vec<ClientMessage>, Vec<AgentMessage>) {
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_version: "0.1.0".into(),
        build_hash: "ab".repeat(32),
        os: "linux".into(),
        arch: "x86_64".into(),
        libc: "glibc 2.36".into(),
        capabilities: vec!["exec".into(), "metrics".into()],
        pid: 4242,
    };
    let client = vec![
        ClientMessage::Request {
            id: 1,
            body: Request::Exec(ExecRequest {
                command: "echo héllo; exit 3".into(),
                cwd: Some("~/work dir".into()),
                env: vec![("A".into(), "b=c".into())],
                stdin: Some(vec![0, 159, 146, 150]),
                timeout_ms: Some(2_000),
                output_limit: 20_000,
                stream: true,
                progress_ms: None,
                hand_over: None,
            }),
        },
        ClientMessage::Request {
            id: u64::MAX,
            body: Request::Ping,
        },
        ClientMessage::Request {
            id: 3,
            body: Request::Metrics,
        },
        ClientMessage::Request {
            id: 4,
            body: Request::GpuLease(GpuLeaseRequest {
                count: 2,
                min_free_mem_bytes: 40 << 30,
            }),
        },
        ClientMessage::Request {
            id: 5,
            body: Request::GpuRelease {
                lease_id: "l-1".into(),
            },
        },
        ClientMessage::Request {
            id: 6,
            body: Request::Scan(ScanRequest {
                root: "~/proj".into(),
                filter: FilterSpec {
                    excludes: vec!["*.pyc".into(), "node_modules/".into()],
                    use_gitignore: true,
                },
                hashes: true,
                chunk_lists: true,
                recursive: true,
                max_entries: 200,
                known: Some([7; 32]),
            }),
        },
        ClientMessage::Request {
            id: 6,
            body: Request::DescribeFiles {
                root: "~/proj".into(),
                paths: vec![b"data/big.bin".to_vec(), b"\xff".to_vec()],
            },
        },
        ClientMessage::Request {
            id: 7,
            body: Request::PutFiles(PutFiles {
                root: "/srv/x".into(),
                create_parents: true,
                files: vec![
                    FilePut {
                        path: b"a\xffb/c d".to_vec(),
                        mode: 0o755,
                        mtime_ns: -5,
                        size: 3,
                        hash: [7; 32],
                        expect: Expect::File {
                            size: 9,
                            mtime_ns: 1_700_000_000_000_000_000,
                        },
                        content: FileContent::Inline(vec![1, 2, 3]),
                    },
                    FilePut {
                        path: b"big".to_vec(),
                        mode: 0o644,
                        mtime_ns: 0,
                        size: 1 << 30,
                        hash: [9; 32],
                        expect: Expect::Absent,
                        content: FileContent::Staged { xfer: 42 },
                    },
                ],
            }),
        },
        ClientMessage::Request {
            id: 8,
            body: Request::PutPart(PutPart {
                root: "/srv/x".into(),
                xfer: 42,
                path: b"big".to_vec(),
                offset: 65536,
                data: PartData::Copy {
                    from_offset: 0,
                    len: 65536,
                },
                hash: [3; 32],
                size: 1 << 30,
            }),
        },
        ClientMessage::Request {
            id: 80,
            body: Request::Resume(Resume {
                root: "/srv/x".into(),
                xfer: 43,
                path: b"dir/big".to_vec(),
                hash: [4; 32],
                size: 3 << 20,
                chunks: vec![ChunkRef {
                    offset: 0,
                    len: 65536,
                    hash: [5; 32],
                }],
            }),
        },
        ClientMessage::Request {
            id: 9,
            body: Request::ApplyMeta(ApplyMeta {
                root: "/srv/x".into(),
                ops: vec![
                    MetaOp::Mkdir {
                        path: b"d".to_vec(),
                        mode: 0o700,
                    },
                    MetaOp::Symlink {
                        path: b"l".to_vec(),
                        target: b"../t".to_vec(),
                    },
                    MetaOp::SetAttrs {
                        path: b"d".to_vec(),
                        mode: 0o755,
                        mtime_ns: 1,
                    },
                    MetaOp::Remove {
                        path: b"old".to_vec(),
                    },
                    MetaOp::Abort { xfer: 42 },
                ],
            }),
        },
        ClientMessage::Request {
            id: 10,
            body: Request::ReadFiles(ReadFiles {
                root: "/srv/x".into(),
                reads: vec![ReadSpec {
                    path: b"big".to_vec(),
                    ranges: Some(vec![(0, 10), (100, 5)]),
                }],
            }),
        },
        ClientMessage::Request {
            id: 11,
            body: Request::JobStart(JobSpec {
                name: Some("train-1".into()),
                command: "python train.py".into(),
                cwd: Some("~/proj".into()),
                env: vec![("A".into(), "1".into())],
                log_file: None,
                watch: WatchSpec {
                    resume_command: Some("python train.py --resume".into()),
                    auto_resume: true,
                    max_resume_attempts: 2,
                    ..Default::default()
                },
                timeout_ms: Some(90_000),
                split_streams: true,
                stdin: Some(b"yes\n".to_vec()),
                sandbox: Some("sbx-3f2a".into()),
            }),
        },
        ClientMessage::Request {
            id: 18,
            body: Request::JobCollect(JobCollect {
                name: "train-1".into(),
                output_limit: 20_000,
                remove_if_ended: true,
                detach: true,
            }),
        },
        ClientMessage::Request {
            id: 12,
            body: Request::JobWait(JobWait {
                name: "train-1".into(),
                cursor: 10,
                timeout_ms: 60_000,
                pattern: Some("loss=".into()),
                silence_ms: Some(5_000),
                max_bytes: 20_000,
            }),
        },
        ClientMessage::Request {
            id: 13,
            body: Request::JobRead(JobRead {
                name: "train-1".into(),
                offset: None,
                tail_lines: Some(50),
                grep: Some("ERROR".into()),
                max_bytes: 20_000,
            }),
        },
        ClientMessage::Request {
            id: 14,
            body: Request::JobList {
                state: Some(JobState::Lost),
                limit: 50,
            },
        },
        ClientMessage::Request {
            id: 15,
            body: Request::JobCancel {
                name: "train-1".into(),
                grace_ms: 3000,
            },
        },
        ClientMessage::Request {
            id: 16,
            body: Request::JobEvents {
                name: None,
                after_seq: 3,
                limit: 100,
            },
        },
        ClientMessage::Request {
            id: 17,
            body: Request::JobStatus {
                name: "train-1".into(),
            },
        },
        ClientMessage::Cancel { id: 1 },
        ClientMessage::Request {
            id: 40,
            body: Request::SandboxCreate(SandboxSpec {
                id: Some("sbx-3f2a".into()),
                ttl_ms: 3_600_000,
                isolation: Isolation::Bwrap,
                network: false,
                limits: SandboxLimits {
                    memory_mb: Some(512),
                    cpu_millis: Some(1500),
                    pids: Some(256),
                    disk_mb: None,
                },
                gpus: 1,
                env: vec![("K".into(), "v".into())],
                keep_files: true,
                max_sandboxes: 8,
                allow_hosts: vec!["pypi.org".into(), "*.github.com:443".into()],
                sandbox_uids: Some((2_000_000_000, 2_000_000_999)),
            }),
        },
        ClientMessage::Request {
            id: 41,
            body: Request::SandboxList,
        },
        ClientMessage::Request {
            id: 42,
            body: Request::SandboxRenew {
                id: "sbx-3f2a".into(),
                ttl_ms: 60_000,
            },
        },
        ClientMessage::Request {
            id: 43,
            body: Request::SandboxDelete {
                id: "sbx-3f2a".into(),
            },
        },
        ClientMessage::Request {
            id: 44,
            body: Request::InSandbox {
                id: "sbx-3f2a".into(),
                request: Box::new(Request::Ping),
            },
        },
    ];
    let job = JobInfo {
        name: "train-1".into(),
        command: "python train.py".into(),
        state: JobState::Exited,
        exit_code: None,
        signal: Some(9),
        pid: Some(1234),
        started_unix: 1_700_000_000,
        ended_unix: Some(1_700_000_100),
        log_file: "/home/u/.outpost/jobs/train-1/log".into(),
        log_size: 1 << 30,
        resume_attempts: 1,
        watch: WatchSpec::default(),
        timed_out: true,
    };
    let agent = vec![
        AgentMessage::Response {
            id: 1,
            body: Response::Output {
                stream: OutputStream::Stderr,
                data: vec![0xff, 0xfe, b'\n'],
            },
        },
        AgentMessage::Response {
            id: 1,
            body: Response::ExecDone(ExecResult {
                exit_code: None,
                signal: Some(9),
                timed_out: true,
                cancelled: false,
                stdout: CapturedOutput {
                    head: b"head".to_vec(),
                    tail: b"tail".to_vec(),
                    omitted: 5 << 20,
                },
                stderr: CapturedOutput::default(),
                duration_ms: 2_010,
                egress_denied: vec!["example.com:443".into()],
                listening: Vec::new(),
            }),
        },
        AgentMessage::Response {
            id: 2,
            body: Response::Pong,
        },
        AgentMessage::Response {
            id: 3,
            body: Response::Metrics(HostMetrics {
                cpu_count: 2,
                load_1m: 0.5,
                load_5m: 0.25,
                load_15m: 0.125,
                mem_total_bytes: 24 << 30,
                mem_used_bytes: 1 << 30,
                mem_available_bytes: 23 << 30,
                swap_total_bytes: 0,
                swap_used_bytes: 0,
                uptime_s: 99,
                cpu_usage_pct: Some(12.5),
                per_cpu_pct: vec![10.0, 15.0],
                disks: vec![DiskUsage {
                    role: "home".into(),
                    path: "/home/u".into(),
                    mount_point: "/".into(),
                    total_bytes: 1 << 40,
                    available_bytes: 1 << 39,
                }],
                process_count: 321,
                gpu: GpuReport {
                    source: Some(GpuSource::Nvml),
                    gpus: vec![GpuInfo {
                        index: 0,
                        name: "NVIDIA H100".into(),
                        uuid: "GPU-1234".into(),
                        util_pct: Some(87),
                        mem_used_bytes: 70 << 30,
                        mem_total_bytes: 80 << 30,
                        temperature_c: Some(61),
                        power_w: Some(412.5),
                        processes: vec![GpuProcess {
                            pid: 77,
                            user: "alice".into(),
                            command: "python train.py".into(),
                            mem_bytes: Some(69 << 30),
                        }],
                        lease: Some("l-1".into()),
                    }],
                    failed: false,
                    problems: vec!["nvidia-smi: not found".into()],
                },
                age_ms: 420,
                slurm: Some(SlurmSummary {
                    partitions: vec![SlurmPartition {
                        name: "gpu".into(),
                        default: true,
                        up: true,
                        nodes_idle: 1,
                        nodes_allocated: 2,
                        nodes_other: 1,
                        cpus_idle: 40,
                        cpus_total: 256,
                        gres: "gpu:a100:4".into(),
                    }],
                    error: None,
                }),
            }),
        },
        AgentMessage::Response {
            id: 4,
            body: Response::GpuLease(GpuLease {
                lease_id: "l-1".into(),
                indices: vec![0, 3],
                uuids: vec!["GPU-a".into(), "GPU-b".into()],
            }),
        },
        AgentMessage::Response {
            id: 5,
            body: Response::Released,
        },
        AgentMessage::Response {
            id: 6,
            body: Response::Entries(vec![TreeEntry {
                path: b"dir/file".to_vec(),
                kind: EntryKind::Symlink {
                    target: b"/etc".to_vec(),
                },
                mode: 0o777,
                size: 4,
                mtime_ns: 12,
                hash: Some([1; 32]),
                chunks: vec![ChunkRef {
                    offset: 0,
                    len: 65536,
                    hash: [2; 32],
                }],
            }]),
        },
        AgentMessage::Response {
            id: 6,
            body: Response::ScanDone(ScanSummary {
                root_exists: true,
                truncated: true,
                problems: vec![PathProblem {
                    path: b"x".to_vec(),
                    message: "Permission denied".into(),
                }],
                partials: vec![Partial {
                    dir: b"models".to_vec(),
                    hash_prefix: [6; 16],
                    size: 1 << 33,
                }],
                digest: Some([9; 32]),
                unchanged: true,
                delta: true,
                removed: vec![b"old/gone.txt".to_vec()],
            }),
        },
        AgentMessage::Response {
            id: 60,
            body: Response::Resumed {
                present: vec![0, 2, 3],
            },
        },
        AgentMessage::Response {
            id: 7,
            body: Response::Applied(ApplyReport {
                done: 3,
                problems: vec![],
            }),
        },
        AgentMessage::Response {
            id: 8,
            body: Response::Ack,
        },
        AgentMessage::Response {
            id: 10,
            body: Response::FileData {
                index: 0,
                offset: 100,
                data: vec![5; 10],
            },
        },
        AgentMessage::Response {
            id: 10,
            body: Response::ReadDone { problems: vec![] },
        },
        AgentMessage::Response {
            id: 11,
            body: Response::Job(job.clone()),
        },
        AgentMessage::Response {
            id: 18,
            body: Response::JobCollected {
                job: job.clone(),
                result: ExecResult {
                    exit_code: None,
                    signal: Some(15),
                    timed_out: true,
                    cancelled: false,
                    stdout: CapturedOutput {
                        head: b"epoch 1\n".to_vec(),
                        tail: b"epoch 9\n".to_vec(),
                        omitted: 4096,
                    },
                    stderr: CapturedOutput::default(),
                    duration_ms: 90_000,
                    egress_denied: Vec::new(),
                    listening: Vec::new(),
                },
            },
        },
        AgentMessage::Response {
            id: 14,
            body: Response::Jobs {
                jobs: vec![job.clone()],
                omitted: 12,
            },
        },
        AgentMessage::Response {
            id: 12,
            body: Response::JobWaited(JobWaited {
                job: job.clone(),
                reason: WaitReason::Matched,
                output: b"epoch 3 loss=0.2\n".to_vec(),
                omitted: 7,
                cursor_after: 99,
            }),
        },
        AgentMessage::Response {
            id: 13,
            body: Response::JobLog(JobLog {
                data: b"ERROR x\n".to_vec(),
                offset: 0,
                next_offset: 8,
                log_size: 8,
            }),
        },
        AgentMessage::Response {
            id: 16,
            body: Response::JobEvents(vec![JobEvent {
                seq: 4,
                job: "train-1".into(),
                kind: "interrupted".into(),
                at_unix: 1_700_000_050,
                detail: "shim gone".into(),
            }]),
        },
        AgentMessage::Response {
            id: 4,
            body: Response::Error(AgentError {
                kind: ErrorKind::SpawnFailed,
                message: "no such directory: /nope".into(),
            }),
        },
        AgentMessage::Response {
            id: 40,
            body: Response::Sandbox(sandbox_info()),
        },
        AgentMessage::Response {
            id: 41,
            body: Response::Sandboxes(vec![sandbox_info()]),
        },
    ];
    (hello, client, agent)
}

fn sandbox_info() -> SandboxInfo {
    SandboxInfo {
        id: "sbx-3f2a".into(),
        state: SandboxState::Expired,
        created_unix: 1_700_000_000,
        expires_unix: 1_700_003_600,
        isolation: Isolation::Landlock,
        network: true,
        limits: SandboxLimits::default(),
        enforcement: "rlimit: pids".into(),
        gpus: vec![0],
        work_dir: "/home/u/.outpost/sandboxes/sbx-3f2a/work".into(),
        kept_files: false,
        ports: vec![8000],
        note: Some("expired".into()),
    }
}

fn one_frame(bytes: &[u8]) -> Vec<u8> {
    let mut dec = FrameDecoder::framed();
    dec.push(bytes);
    match dec.next_event().unwrap() {
        Some(DecodeEvent::Frame(p)) => p.into_vec(),
        other => panic!("expected a frame, got {other:?}"),
    }
}

#[test]
fn every_message_round_trips() {
    let (hello, client, agent) = sample_messages();
    let payload = one_frame(&encode_frame(&hello).unwrap());
    assert_eq!(decode::<Hello>(&payload).unwrap(), hello);
    assert_eq!(
        decode::<HelloVersion>(&payload).unwrap().protocol_version,
        PROTOCOL_VERSION
    );
    for msg in client {
        let payload = one_frame(&encode_frame(&msg).unwrap());
        assert_eq!(decode::<ClientMessage>(&payload).unwrap(), msg);
    }
    for msg in agent {
        let payload = one_frame(&encode_frame(&msg).unwrap());
        assert_eq!(decode::<AgentMessage>(&payload).unwrap(), msg);
    }
}

#[test]
fn oversized_message_is_refused_when_encoding() {
    let msg = AgentMessage::Response {
        id: 1,
        body: Response::Output {
            stream: OutputStream::Stdout,
            data: vec![0; MAX_FRAME_LEN + 1],
        },
    };
    assert!(matches!(
        encode_frame(&msg),
        Err(ProtocolError::FrameTooLarge { .. })
    ));
}

#[test]
fn captured_output_marks_what_was_omitted() {
    let out = CapturedOutput {
        head: b"first".to_vec(),
        tail: b"last\xff".to_vec(),
        omitted: 1234,
    };
    assert_eq!(out.total_len(), 1234 + 10);
    assert_eq!(
        out.to_text(),
        "first\n[… 1234 bytes omitted …]\nlast\u{fffd}"
    );
}

/// xorshift64*: deterministic, dependency-free randomness for the fuzz loop.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Rounds of the fuzz loop: `OUTPOST_FUZZ_ITERS`, else 20 000 (about a
/// second). `scripts/test` asks for more under CI.
fn fuzz_iters() -> u64 {
    std::env::var("OUTPOST_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(20_000)
}

/// The fuzz loop's seed: `OUTPOST_FUZZ_SEED` (to replay or explore), else a
/// fixed one, so a failure reproduces.
fn fuzz_seed() -> u64 {
    std::env::var("OUTPOST_FUZZ_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
}

/// A valid frame, random bytes, or several frames run together, then
/// damaged: bytes overwritten (sometimes in a length prefix), cut short, a
/// stretch repeated, or a stretch cut out.
fn fuzz_input(rng: &mut Rng, valid: &[Vec<u8>], round: u64) -> Vec<u8> {
    let mut bytes = match round % 4 {
        0 | 2 => valid[rng.below(valid.len())].clone(),
        1 => {
            let len = rng.below(256);
            (0..len).map(|_| rng.next() as u8).collect()
        }
        _ => (0..1 + rng.below(3))
            .flat_map(|_| valid[rng.below(valid.len())].clone())
            .collect(),
    };
    for _ in 0..rng.below(4) {
        if bytes.is_empty() {
            break;
        }
        let i = rng.below(bytes.len());
        match rng.below(8) {
            0 => bytes.truncate(i),
            1 => {
                let end = (i + 1 + rng.below(16)).min(bytes.len());
                let copy = bytes[i..end].to_vec();
                bytes.splice(i..i, copy);
            }
            2 => {
                let end = (i + 1 + rng.below(16)).min(bytes.len());
                bytes.drain(i..end);
            }
            _ => bytes[i] = rng.next() as u8,
        }
    }
    bytes
}

#[test]
fn random_and_mutated_input_never_panics() {
    let (hello, client, agent) = sample_messages();
    let mut valid: Vec<Vec<u8>> = vec![encode_frame(&hello).unwrap()];
    valid.extend(client.iter().map(|m| encode_frame(m).unwrap()));
    valid.extend(agent.iter().map(|m| encode_frame(m).unwrap()));
    let (iters, seed) = (fuzz_iters(), fuzz_seed());
    let mut rng = Rng(seed | 1);
    for round in 0..iters {
        let bytes = fuzz_input(&mut rng, &valid, round);
        let mut dec = if round % 3 == 0 {
            let mut d = FrameDecoder::after_preamble();
            d.push(&PREAMBLE);
            d
        } else {
            FrameDecoder::framed()
        };
        // Whole, or in pieces as a pipe delivers them.
        let pieces: Vec<&[u8]> = if round % 5 == 4 && !bytes.is_empty() {
            bytes.chunks(1 + rng.below(bytes.len())).collect()
        } else {
            vec![&bytes[..]]
        };
        'input: for piece in pieces {
            dec.push(piece);
            loop {
                match dec.next_event() {
                    Ok(Some(DecodeEvent::Frame(p))) => {
                        let _ = decode::<ClientMessage>(&p);
                        let _ = decode::<AgentMessage>(&p);
                        let _ = decode::<Hello>(&p);
                    }
                    Ok(Some(DecodeEvent::Noise(_))) => {}
                    Ok(None) => break,
                    Err(_) => break 'input,
                }
            }
        }
        // Whatever the input claimed, the decoder never holds more than it was given
        // plus one frame-sized reservation.
        assert!(
            dec.buffered() <= bytes.len() + PREAMBLE.len(),
            "round {round} of seed {seed}"
        );
    }
}

#[test]
fn a_huge_vec_length_inside_a_frame_is_a_decode_error() {
    // A frame whose payload claims a multi-gigabyte Vec must fail, not allocate.
    let mut payload = vec![0u8, 1, 0]; // Response variant, id 1, Output
    payload.extend([0u8]); // Stdout
    payload.extend([0xff, 0xff, 0xff, 0xff, 0x0f]); // varint length ~4 GiB
    assert!(decode::<AgentMessage>(&payload).is_err());
}

#[test]
fn byte_fields_encode_as_plain_sequences() {
    // Byte fields are (de)serialized as bytes, in one copy instead of one
    // call per byte; on the wire that is the same varint length and raw bytes
    // as a sequence of u8, so peers built before the change still agree.
    #[derive(serde::Serialize)]
    struct AsSequence {
        path: Vec<u8>,
        message: String,
    }
    let path = b"dir/\xffname".to_vec();
    let message = "gone".to_string();
    let as_bytes = PathProblem {
        path: path.clone(),
        message: message.clone(),
    };
    assert_eq!(
        postcard::to_allocvec(&as_bytes).unwrap(),
        postcard::to_allocvec(&AsSequence { path, message }).unwrap()
    );
}
