//! The status page's cost: how soon after the page opens its event stream
//! the first snapshot arrives (what the page renders), and the server's
//! CPU over 30 s with one page open against 30 s with none.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use outpost_e2e::McpHttp;

use crate::ms;

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(')').unwrap().1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The server's CPU use over `span`, in % of one core.
fn cpu_over(pid: u32, span: Duration) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let before = cpu_ticks(pid);
    std::thread::sleep(span);
    (cpu_ticks(pid) - before) as f64 / hz / span.as_secs_f64() * 100.0
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
    println!("  server CPU, no page open    {idle:.2} % of a core");
    println!("  server CPU, one page open   {open:.2} % of a core (a sample every 3 s)");
    let _ = events.shutdown(std::net::Shutdown::Both);
    let _ = reader.join();
}
