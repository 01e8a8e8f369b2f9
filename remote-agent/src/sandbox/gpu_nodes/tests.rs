//! Stand-in device nodes (made with mknod, so these tests need root) and a
//! stand-in driver directory: no GPU needed.

use super::*;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn scratch(label: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("outpost-{label}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn mknod(path: &Path, major: u32, minor: u32) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; plain syscall.
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        rc,
        0,
        "mknod {} (these tests make stand-in device nodes, as root): {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Two GPUs whose minors are the reverse of their indices, as the driver
/// tells them, the shared nodes, and things that only look like GPU nodes.
fn host(dir: &Path) -> (PathBuf, PathBuf) {
    let (dev, driver) = (dir.join("dev"), dir.join("driver"));
    fs::create_dir_all(&dev).unwrap();
    mknod(&dev.join("nvidia0"), 195, 0);
    mknod(&dev.join("nvidia1"), 195, 1);
    mknod(&dev.join("nvidiactl"), 195, 255);
    mknod(&dev.join("nvidia-uvm"), 511, 0);
    fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
    fs::write(dev.join("nvidia7"), b"a file, not a node").unwrap();
    mknod(&dev.join("nvidia8"), 1, 3);
    for (bus, uuid, minor) in [
        ("0000:18:00.0", "GPU-aaa", 1),
        ("0000:3b:00.0", "GPU-bbb", 0),
    ] {
        let gpu = driver.join("gpus").join(bus);
        fs::create_dir_all(&gpu).unwrap();
        fs::write(
            gpu.join("information"),
            format!("Model: \t\t Stand-in\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"),
        )
        .unwrap();
    }
    (dev, driver)
}

fn names(nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .map(|n| n.inside.display().to_string())
        .collect()
}

#[test]
fn a_leased_gpu_is_found_by_the_minor_the_driver_gave_it() {
    let dir = scratch("gpu-nodes");
    let (dev, driver) = host(&dir.0);
    let first = [Leased {
        index: 0,
        uuid: "GPU-aaa",
    }];
    let nodes = nodes_in(&first, &dev, &driver).unwrap();
    assert_eq!(
        names(&nodes),
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-caps",
            "/dev/nvidia1"
        ]
    );
    assert_eq!(nodes[3].host, dev.join("nvidia1"));
    // No GPU: the shared nodes only.
    assert_eq!(nodes_in(&[], &dev, &driver).unwrap().len(), 3);
    // Without the driver's word, the index; a minor with no node is refused.
    let unknown = [Leased { index: 1, uuid: "" }];
    assert_eq!(
        names(&nodes_in(&unknown, &dev, &driver).unwrap())[3],
        "/dev/nvidia1"
    );
    let missing = [Leased {
        index: 7,
        uuid: "GPU-zzz",
    }];
    let err = nodes_in(&missing, &dev, &driver).unwrap_err();
    assert!(err.contains("major 195 and minor 7"), "{err}");
}

/// Through a real bwrap, as the sandbox is made: the leased node is there
/// (opening it reaches the kernel, which has no driver behind it here),
/// the other GPU's is not.
#[test]
fn bwrap_shows_exactly_the_leased_node() {
    let dir = scratch("gpu-bwrap");
    let (dev, driver) = host(&dir.0);
    let leased = [Leased {
        index: 1,
        uuid: "GPU-bbb",
    }];
    let nodes = nodes_in(&leased, &dev, &driver).unwrap();
    let mut cmd = std::process::Command::new("bwrap");
    cmd.env("LC_ALL", "C").args([
        "--unshare-user",
        "--unshare-pid",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
    ]);
    for node in &nodes {
        cmd.arg("--dev-bind").arg(&node.host).arg(&node.inside);
    }
    let script = "ls /dev | grep nvidia | tr '\\n' ' '; echo; \
                  test -c /dev/nvidia0 && echo FIRST_NODE_MAJOR=$(stat -c %t /dev/nvidia0); \
                  exec 3</dev/nvidia0; echo opened";
    let out = cmd.args(["sh", "-c", script]).output().expect("bwrap runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let listed: Vec<&str> = stdout
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        listed,
        ["nvidia-caps", "nvidia-uvm", "nvidia0", "nvidiactl"],
        "{stdout}{stderr}"
    );
    assert!(stdout.contains("FIRST_NODE_MAJOR=c3"), "{stdout}{stderr}");
    // The node's minor 0 leads to the kernel, which finds no driver.
    assert!(
        stderr.contains("No such device or address"),
        "{stdout}{stderr}"
    );
}
