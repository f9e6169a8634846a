//! Conntrack kernel test (root) in a private netns: real UDP/TCP traffic over
//! loopback with an nft DNAT rule creates entries; `conntrack -L` is the oracle.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;

use kube_nlproxy_netlink::conntrack::*;

fn in_netns<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) with CLONE_NEWNET only changes this thread's netns.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `conntrack -L -p PROTO` lines (the oracle).
fn ct_lines(proto: &str) -> Vec<String> {
    run("conntrack", &["-L", "-p", proto])
        .lines()
        .map(str::to_string)
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn udp_from(src_port: u16, dst: &str) {
    let s = UdpSocket::bind(SocketAddr::new(ip("127.0.0.1"), src_port)).unwrap();
    s.send_to(b"x", dst).unwrap();
}

const RULES: &str = "
table ip kn-ct-test {
  chain out-nat {
    type nat hook output priority -100;
    ip daddr 10.96.0.10 udp dport 53 dnat to 127.0.0.3:5353
  }
  chain out-filter {
    type filter hook output priority 0;
    ct state new counter
  }
}
";

#[test]
fn kernel_conntrack_delete_udp() {
    in_netns(|| {
        run("ip", &["link", "set", "lo", "up"]);
        run("ip", &["addr", "add", "10.96.0.10/32", "dev", "lo"]);
        let mut nft = Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        nft.stdin
            .take()
            .unwrap()
            .write_all(RULES.as_bytes())
            .unwrap();
        assert!(nft.wait().unwrap().success(), "nft -f");

        // 3 flows to the VIP:53 (DNATed to 127.0.0.3:5353), 1 to VIP:54, 1 elsewhere.
        for p in [40001, 40002, 40003] {
            udp_from(p, "10.96.0.10:53");
        }
        udp_from(40004, "10.96.0.10:54");
        udp_from(40005, "127.0.0.4:53");
        // Established TCP to the VIP and to another address: must survive.
        let l1 = TcpListener::bind("10.96.0.10:53").unwrap();
        let l2 = TcpListener::bind("127.0.0.5:8080").unwrap();
        let _c1 = TcpStream::connect("10.96.0.10:53").unwrap();
        let _c2 = TcpStream::connect("127.0.0.5:8080").unwrap();
        let _a1 = l1.accept().unwrap();
        let _a2 = l2.accept().unwrap();

        let h = ConntrackHandle::new().unwrap();
        let entries = h.list(false).unwrap();
        let udp: Vec<_> = entries.iter().filter(|e| e.orig.proto == 17).collect();
        assert_eq!(udp.len(), 5, "{entries:#?}");
        let dnat: Vec<_> = udp
            .iter()
            .filter(|e| e.reply.src == ip("127.0.0.3"))
            .collect();
        assert_eq!(dnat.len(), 3);
        assert!(
            dnat.iter()
                .all(|e| e.reply.sport == 5353 && e.orig.dport == 53)
        );
        assert!(entries.iter().all(|e| e.id.is_some()));

        // Oracle agrees before deleting.
        let cli = ct_lines("udp");
        assert_eq!(cli.len(), 5, "{cli:?}");
        assert_eq!(
            cli.iter()
                .filter(|l| l.contains("src=127.0.0.3") && l.contains("sport=5353"))
                .count(),
            3
        );
        assert_eq!(ct_lines("tcp").len(), 2);

        // VIP:54 only.
        assert_eq!(
            h.delete_udp_to(ip("10.96.0.10"), Some(54), L4Proto::Udp)
                .unwrap(),
            1
        );
        assert!(!ct_lines("udp").iter().any(|l| l.contains("dport=54")));
        assert_eq!(ct_lines("udp").len(), 4);

        // Everything DNATed to the endpoint 127.0.0.3:5353.
        assert_eq!(
            h.delete_by_reply_src(ip("127.0.0.3"), 5353, L4Proto::Udp)
                .unwrap(),
            3
        );
        assert_eq!(
            h.delete_by_reply_src(ip("127.0.0.3"), 5353, L4Proto::Udp)
                .unwrap(),
            0
        );
        let cli = ct_lines("udp");
        assert_eq!(cli.len(), 1, "{cli:?}");
        assert!(cli[0].contains("dst=127.0.0.4"));

        // UDP to the VIP, any port: nothing left, TCP to the VIP untouched.
        assert_eq!(
            h.delete_udp_to(ip("10.96.0.10"), None, L4Proto::Udp)
                .unwrap(),
            0
        );
        let tcp = ct_lines("tcp");
        assert_eq!(tcp.len(), 2, "{tcp:?}");
        assert!(tcp.iter().any(|l| l.contains("dst=10.96.0.10")));

        assert_eq!(
            h.delete_udp_to(ip("127.0.0.4"), None, L4Proto::Udp)
                .unwrap(),
            1
        );
        assert!(ct_lines("udp").is_empty());
        assert_eq!(
            h.list(false)
                .unwrap()
                .iter()
                .filter(|e| e.orig.proto == 6)
                .count(),
            2
        );
        // IPv6 table is empty and dumps fine.
        assert!(h.list(true).unwrap().is_empty());
    });
}
