//! The status page's cost: how soon after the page opens its event stream
//! the first snapshot arrives (what the page renders), and the server's
//! CPU over 30 s with one page open against 30 s with none.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use outpost_e2e::McpHttp;

use crate::ms;

/// utime + stime of `pid`, in clock ticks (none once it is gone).
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The CPU use of the server and of the local host's agents over `span`,
/// in % of one core.
fn cpu_over(pid: u32, span: Duration) -> (f64, f64) {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let agents = || -> u64 {
        outpost_e2e::pids_with_cmdline("outpost-agent")
            .into_iter()
            .filter_map(cpu_ticks)
            .sum()
    };
    let pid = pid as i32;
    let (server, agent) = (cpu_ticks(pid).unwrap(), agents());
    std::thread::sleep(span);
    let share = |ticks: u64| ticks as f64 / hz / span.as_secs_f64() * 100.0;
    (
        share(cpu_ticks(pid).unwrap() - server),
        share(agents().saturating_sub(agent)),
    )
}

pub(crate) fn status_page() {
    let server = McpHttp::start();
    println!("status page (one server, the local host):");
    let idle = cpu_over(server.pid(), Duration::from_secs(30));

    let t = Instant::now();
    let mut page = TcpStream::connect(&server.addr).unwrap();
    write!(
        page,
        "GET / HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        server.addr, server.token
    )
    .unwrap();
    let mut html = String::new();
    std::io::Read::read_to_string(&mut page, &mut html).unwrap();
    assert!(html.contains("status.js"));
    let mut events = TcpStream::connect(&server.addr).unwrap();
    write!(
        events,
        "GET /status/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
        server.addr, server.token
    )
    .unwrap();
    let mut lines = BufReader::new(events.try_clone().unwrap()).lines();
    while !lines
        .next()
        .unwrap()
        .unwrap()
        .starts_with("event: snapshot")
    {}
    println!("  page and first snapshot     {}", ms(t.elapsed()));
    // Keep reading, as a page does, while the server's CPU is measured.
    let reader = std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    let open = cpu_over(server.pid(), Duration::from_secs(30));
    println!(
        "  CPU, no page open           server {:.2} %, agents {:.2} % of a core",
        idle.0, idle.1
    );
    println!(
        "  CPU, one page open          server {:.2} %, agents {:.2} % of a core (a sample every 3 s)",
        open.0, open.1
    );
    let _ = events.shutdown(std::net::Shutdown::Both);
    let _ = reader.join();
}
