//! The IPVS codec against what `ipvsadm` really sends, captured with
//! `strace -e write=all` inside the VM (the host has no IPVS): our parser reads
//! ipvsadm's NEW_SERVICE / NEW_DEST messages into exactly the service and
//! destination we would send for the same command; our NEW_SERVICE is byte for byte
//! ipvsadm's, our NEW_DEST carries the same attributes. Skips on a host without IPVS (`KNP_VM` unset).

mod common;

use std::net::IpAddr;
use std::process::Command;

use kube_nlproxy_netlink::ipvs::codec::IpvsMessage;
use kube_nlproxy_netlink::ipvs::{
    IpvsDestination, IpvsHandle, IpvsProtocol, IpvsService, parse_services, request,
};
use netlink_packet_core::{Emitable, Parseable};

fn skip_on_host(test: &str) -> bool {
    common::skip_outside_vm("vm_ipvs_golden", test)
}

/// The netlink messages written by `ipvsadm ARGS`, from strace's hex dumps.
fn ipvsadm_messages(args: &[&str]) -> Vec<Vec<u8>> {
    let trace = std::env::temp_dir().join(format!("ipvsadm-{}.trace", std::process::id()));
    let status = Command::new("strace")
        .args(["-f", "-e", "trace=sendmsg", "-e", "write=all", "-o"])
        .arg(&trace)
        .arg("ipvsadm")
        .args(args)
        .status()
        .expect("run strace");
    assert!(status.success(), "ipvsadm {args:?} failed");
    let text = std::fs::read_to_string(&trace).unwrap();
    let _ = std::fs::remove_file(&trace);
    let mut msgs: Vec<Vec<u8>> = Vec::new();
    for line in text.lines() {
        if line.contains("sendmsg(") {
            msgs.push(Vec::new());
        } else if let Some(rest) = line.trim_start().strip_prefix("| ") {
            // "| 00010  03 01 00 00 09 00 ...  ascii |"
            let hex = &rest[7..rest.len().min(7 + 50)];
            let cur = msgs.last_mut().expect("dump after sendmsg");
            cur.extend(
                hex.split_whitespace()
                    .map(|b| u8::from_str_radix(b, 16).expect("hex byte")),
            );
        }
    }
    msgs
}

/// The genl payload (after the 16-byte nlmsghdr) of the message with `cmd`.
fn genl_payload(msgs: &[Vec<u8>], family: u16, cmd: u8) -> Vec<u8> {
    msgs.iter()
        .find(|m| m.len() > 16 && u16::from_ne_bytes([m[4], m[5]]) == family && m[16] == cmd)
        .map(|m| {
            let len = u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as usize;
            m[16..len].to_vec()
        })
        .unwrap_or_else(|| panic!("no message with cmd {cmd} in {msgs:?}"))
}

fn emit(m: &IpvsMessage) -> Vec<u8> {
    let mut buf = vec![0; m.buffer_len()];
    m.emit(&mut buf);
    buf
}

#[test]
fn ipvsadm_bytes_parse_into_what_we_send() {
    if skip_on_host("ipvsadm_bytes_parse_into_what_we_send") {
        return;
    }
    std::thread::spawn(|| {
        // SAFETY: unshare(CLONE_NEWNET) changes only this thread's namespace (and
        // the ipvsadm children it forks): IPVS state is per namespace.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        let handle = IpvsHandle::new().expect("IPVS family");
        let family = handle.family_id();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();

        let cases: Vec<(Vec<&str>, IpvsService)> = vec![
            (
                vec!["-A", "-t", "10.96.0.10:80", "-s", "rr"],
                IpvsService::new(IpvsProtocol::Tcp, ip("10.96.0.10"), 80).scheduler("rr"),
            ),
            (
                vec!["-A", "-u", "10.96.0.11:53", "-s", "wlc", "-p", "180"],
                IpvsService::new(IpvsProtocol::Udp, ip("10.96.0.11"), 53)
                    .scheduler("wlc")
                    .persistent(180),
            ),
            (
                vec!["-A", "-t", "[fd96::10]:443", "-s", "sh"],
                IpvsService::new(IpvsProtocol::Tcp, ip("fd96::10"), 443).scheduler("sh"),
            ),
        ];
        for (args, want) in &cases {
            let captured = genl_payload(&ipvsadm_messages(args), family, 1);
            let parsed = IpvsMessage::parse(&captured[..]).expect("parse ipvsadm's bytes");
            let got = parse_services(std::slice::from_ref(&parsed)).unwrap();
            assert_eq!(got, vec![want.clone()], "ipvsadm {args:?}");
            // Ours carries the same service (attribute order aside)…
            let ours = emit(&request::new_service(want));
            let back = IpvsMessage::parse(&ours[..]).unwrap();
            assert_eq!(parse_services(&[back]).unwrap(), vec![want.clone()]);
            // …and the kernel holds what ipvsadm created.
            assert!(handle.list_services().unwrap().contains(want));
            assert_eq!(
                captured, ours,
                "ipvsadm {args:?}: our NEW_SERVICE differs from ipvsadm's"
            );
        }

        // A real server: ipvsadm -a … -m -w 3 (NEW_DEST, cmd 5). IPVS wants a
        // unicast-routable address: give the namespace a route to it.
        for args in [
            &["link", "add", "d0", "type", "dummy"][..],
            &["link", "set", "d0", "up"],
            &["addr", "add", "10.244.1.1/24", "dev", "d0"],
        ] {
            assert!(
                Command::new("ip").args(args).status().unwrap().success(),
                "ip {args:?}"
            );
        }
        let svc = &cases[0].1;
        let args = [
            "-a",
            "-t",
            "10.96.0.10:80",
            "-r",
            "10.244.1.2:8080",
            "-m",
            "-w",
            "3",
        ];
        let captured = genl_payload(&ipvsadm_messages(&args), family, 5);
        let parsed = IpvsMessage::parse(&captured[..]).unwrap();
        let want = IpvsDestination::new(ip("10.244.1.2"), 8080).weight(3);
        let listed = handle.list_destinations(svc).unwrap();
        assert_eq!(listed, vec![want.clone()]);
        let ours = emit(&request::new_dest(svc, &want));
        let back = IpvsMessage::parse(&ours[..]).unwrap();
        // Same attributes, except that ipvsadm also sends the tunnel fields
        // (TUN_TYPE, TUN_PORT, TUN_FLAGS = 13, 14, 15), all zero for masquerading;
        // we leave them out so kernels before 5.3, which lack them, accept ours.
        let ipvsadm_attrs: Vec<String> = dest_attrs(&parsed)
            .into_iter()
            .filter(|a| {
                ![
                    "kind: 13, value: [0]",
                    "kind: 14, value: [0, 0]",
                    "kind: 15, value: [0, 0]",
                ]
                .iter()
                .any(|t| a.contains(t))
            })
            .collect();
        assert_eq!(
            ipvsadm_attrs,
            dest_attrs(&back),
            "NEW_DEST attributes differ:\n  ipvsadm {captured:02x?}\n  ours    {ours:02x?}"
        );
        eprintln!("NEW_DEST byte-identical to ipvsadm's: {}", captured == ours);
    })
    .join()
    .unwrap();
}

/// The destination attributes of a NEW_DEST message, sorted by kind (the order on
/// the wire does not matter to the kernel).
fn dest_attrs(m: &IpvsMessage) -> Vec<String> {
    use kube_nlproxy_netlink::ipvs::codec::IpvsCmdAttr;
    let mut out: Vec<String> = m
        .attributes
        .iter()
        .filter_map(|a| match a {
            IpvsCmdAttr::Dest(d) => Some(d.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    out.sort();
    out
}

/// Pipelined requests: a service and 300 real servers in one go, one of them a
/// duplicate. The kernel answers each in order: the duplicate alone fails
/// (EEXIST), `ipvsadm -Ln` sees the service with its 300 real servers.
#[test]
fn pipelined_requests_each_get_their_own_answer() {
    use kube_nlproxy_netlink::ipvs::{IpvsError, IpvsRequest};
    if skip_on_host("pipelined_requests_each_get_their_own_answer") {
        return;
    }
    let ipvs = IpvsHandle::new().expect("IPVS in the VM");
    let vip: IpAddr = "10.199.0.1".parse().unwrap();
    let svc = IpvsService::new(IpvsProtocol::Tcp, vip, 8099).scheduler("rr");
    let dests: Vec<IpvsDestination> = (0..300u16)
        .map(|i| {
            let ip: IpAddr = format!("10.200.{}.{}", i / 200, 1 + i % 200)
                .parse()
                .unwrap();
            IpvsDestination::new(ip, 8080).weight(1)
        })
        .collect();
    let mut requests = vec![IpvsRequest::AddService(&svc)];
    requests.extend(dests.iter().map(|d| IpvsRequest::AddDestination(&svc, d)));
    requests.push(IpvsRequest::AddDestination(&svc, &dests[7]));
    let results = ipvs.apply_pipelined(&requests);
    assert_eq!(results.len(), 302);
    for (i, r) in results.iter().enumerate().take(301) {
        assert!(r.is_ok(), "request {i}: {r:?}");
    }
    match &results[301] {
        Err(IpvsError::Kernel { errno, .. }) => assert_eq!(*errno, libc::EEXIST),
        other => panic!("the duplicate: {other:?}"),
    }
    let out = Command::new("ipvsadm")
        .args(["-Ln", "-t", "10.199.0.1:8099"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("-> 10.200.").count(), 300, "{text}");
    let results = ipvs.apply_pipelined(&[IpvsRequest::DelService(&svc)]);
    assert!(results[0].is_ok());
}

/// `ipvsadm --set TCP TCPFIN UDP` against ours: the same SET_CONFIG bytes
/// (cmd 12), parsed into the same timeouts; the kernel's GET_CONFIG reply
/// (read through our handle) gives them back, and `ipvsadm -L --timeout` shows
/// what we set.
#[test]
fn set_config_is_ipvsadms_and_get_config_reads_it_back() {
    use kube_nlproxy_netlink::ipvs::{IpvsTimeouts, parse_timeouts};
    if skip_on_host("set_config_is_ipvsadms_and_get_config_reads_it_back") {
        return;
    }
    std::thread::spawn(|| {
        // SAFETY: unshare(CLONE_NEWNET) changes only this thread's namespace (and
        // the ipvsadm children it forks): IPVS timeouts are per namespace.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        let handle = IpvsHandle::new().expect("IPVS family");
        let family = handle.family_id();
        let want = IpvsTimeouts {
            tcp: 901,
            tcp_fin: 121,
            udp: 301,
        };
        let captured = genl_payload(
            &ipvsadm_messages(&["--set", "901", "121", "301"]),
            family,
            12,
        );
        let parsed = IpvsMessage::parse(&captured[..]).expect("parse ipvsadm's SET_CONFIG");
        assert_eq!(parse_timeouts(&parsed), want);
        assert_eq!(
            captured,
            emit(&request::set_config(&want)),
            "SET_CONFIG bytes"
        );
        assert_eq!(
            handle.timeouts().unwrap(),
            want,
            "GET_CONFIG after ipvsadm --set"
        );
        let ours = IpvsTimeouts {
            tcp: 600,
            tcp_fin: 0,
            udp: 5,
        };
        handle.set_timeouts(&ours).unwrap();
        assert_eq!(
            handle.timeouts().unwrap(),
            IpvsTimeouts {
                tcp: 600,
                tcp_fin: 121,
                udp: 5
            },
            "0 leaves tcpfin as it was"
        );
        let out = Command::new("ipvsadm")
            .args(["-L", "--timeout"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(text.contains("(tcp tcpfin udp): 600 121 5"), "{text}");
    })
    .join()
    .unwrap();
}
