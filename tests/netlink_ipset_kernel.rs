//! ipset kernel tests (root): each body runs in a thread with its own network
//! namespace; `ipset` children inherit it and serve as the read-back oracle.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use kube_nlproxy_netlink::ipset::codec::*;
use kube_nlproxy_netlink::ipset::*;
use netlink_packet_core::{Emitable, ParseableParametrized};

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

fn ipset_cli(args: &[&str]) -> String {
    let out = Command::new("ipset")
        .args(args)
        .output()
        .expect("run ipset");
    assert!(
        out.status.success(),
        "ipset {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `add NAME …` lines of `ipset list NAME -o save`, as a set of member strings.
fn saved_members(name: &str) -> BTreeSet<String> {
    ipset_cli(&["list", name, "-o", "save"])
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("add {name} ")).map(str::to_string))
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const TCP: u8 = libc::IPPROTO_TCP as u8;
const UDP: u8 = libc::IPPROTO_UDP as u8;

fn fmt_ip(a: &IpAddr) -> String {
    a.to_string()
}

/// `ipset save` omits a full-length prefix.
fn fmt_net(a: &IpAddr, cidr: u8) -> String {
    let full = if a.is_ipv4() { 32 } else { 128 };
    if cidr == full {
        fmt_ip(a)
    } else {
        format!("{}/{cidr}", fmt_ip(a))
    }
}

fn proto(p: u8) -> &'static str {
    match p {
        TCP => "tcp",
        UDP => "udp",
        _ => "sctp",
    }
}

/// How `ipset save` renders a member.
fn render(m: &IpsetMember) -> String {
    match m {
        IpsetMember::Ip(a) => fmt_ip(a),
        IpsetMember::IpPort { ip, proto: p, port } => {
            format!("{},{}:{port}", fmt_ip(ip), proto(*p))
        }
        IpsetMember::IpPortIp {
            ip,
            proto: p,
            port,
            ip2,
        } => {
            format!("{},{}:{port},{}", fmt_ip(ip), proto(*p), fmt_ip(ip2))
        }
        IpsetMember::IpPortNet {
            ip,
            proto: p,
            port,
            net,
            cidr,
        } => {
            format!(
                "{},{}:{port},{}",
                fmt_ip(ip),
                proto(*p),
                fmt_net(net, *cidr)
            )
        }
        IpsetMember::Net { addr, cidr } => fmt_net(addr, *cidr),
        IpsetMember::Port(p) => p.to_string(),
        _ => unreachable!(),
    }
}

fn cycle(h: &IpsetHandle, create: IpsetCreate, members: Vec<IpsetMember>, absent: IpsetMember) {
    let name = create.name.clone();
    h.create(&create, false)
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    // Identical create with exist_ok is fine; without it is IPSET_ERR_EXIST.
    h.create(&create, true).unwrap();
    assert_eq!(
        h.create(&create, false).unwrap_err().errno(),
        Some(libc::EEXIST)
    );

    h.add(&name, &members, false)
        .unwrap_or_else(|e| panic!("add to {name}: {e}"));
    // Re-adding: exist_ok passes, strict fails.
    h.add(&name, &members[..1], true).unwrap();
    assert_eq!(
        h.add(&name, &members[..1], false).unwrap_err().errno(),
        Some(IPSET_ERR_EXIST)
    );

    for m in &members {
        assert!(
            h.test(&name, m).unwrap(),
            "{name}: {m:?} should test present"
        );
    }
    assert!(
        !h.test(&name, &absent).unwrap(),
        "{name}: {absent:?} should test absent"
    );

    let listing = h.list(&name).unwrap();
    assert_eq!(listing.type_name, create.kind.name());
    assert_eq!(listing.element_count(), Some(members.len() as u32));
    if create.kind != IpsetType::BitmapPort {
        assert_eq!(
            listing.hash_params(),
            (Some(DEFAULT_HASHSIZE), Some(DEFAULT_MAXELEM))
        );
    }
    let got: BTreeSet<_> = h.members(&name).unwrap().into_iter().collect();
    let want: BTreeSet<_> = members.iter().cloned().collect();
    assert_eq!(got, want, "{name}: list parses back what was added");

    // Oracle: the ipset CLI sees the same members.
    let cli = saved_members(&name);
    let ours: BTreeSet<_> = members.iter().map(render).collect();
    assert_eq!(cli, ours, "{name}: ipset save");

    // Delete one, strict delete of it again fails, tolerant passes.
    h.del(&name, &members[..1], false).unwrap();
    assert!(!h.test(&name, &members[0]).unwrap());
    assert_eq!(
        h.del(&name, &members[..1], false).unwrap_err().errno(),
        Some(IPSET_ERR_EXIST)
    );
    h.del(&name, &members[..1], true).unwrap();
    assert_eq!(h.members(&name).unwrap().len(), members.len() - 1);

    h.flush(&name).unwrap();
    assert!(h.members(&name).unwrap().is_empty());
    h.destroy(&name).unwrap();
    assert!(!h.list_names().unwrap().contains(&name));
}

#[test]
fn kernel_ipset_types_v4_v6() {
    in_netns(|| {
        let h = IpsetHandle::new().expect("ipset handle");
        assert!(h.protocol() >= IPSET_PROTOCOL_MIN);
        use IpsetFamily::*;
        use IpsetType::*;

        cycle(
            &h,
            IpsetCreate::hash("t-ip4", HashIp, Inet),
            vec![
                IpsetMember::Ip(ip("10.0.0.1")),
                IpsetMember::Ip(ip("10.0.0.2")),
            ],
            IpsetMember::Ip(ip("10.0.0.3")),
        );
        cycle(
            &h,
            IpsetCreate::hash("t-ip6", HashIp, Inet6),
            vec![
                IpsetMember::Ip(ip("fd00::1")),
                IpsetMember::Ip(ip("fd00::2")),
            ],
            IpsetMember::Ip(ip("fd00::3")),
        );
        for (name, fam, a, b) in [
            ("t-ipport4", Inet, "10.0.0.1", "10.0.0.2"),
            ("t-ipport6", Inet6, "fd00::1", "fd00::2"),
        ] {
            cycle(
                &h,
                IpsetCreate::hash(name, HashIpPort, fam),
                vec![
                    IpsetMember::IpPort {
                        ip: ip(a),
                        proto: TCP,
                        port: 80,
                    },
                    IpsetMember::IpPort {
                        ip: ip(a),
                        proto: UDP,
                        port: 53,
                    },
                    IpsetMember::IpPort {
                        ip: ip(b),
                        proto: TCP,
                        port: 443,
                    },
                ],
                IpsetMember::IpPort {
                    ip: ip(b),
                    proto: UDP,
                    port: 443,
                },
            );
        }
        for (name, fam, a, b) in [
            ("t-ipportip4", Inet, "10.0.0.1", "10.244.0.5"),
            ("t-ipportip6", Inet6, "fd00::1", "fd00:244::5"),
        ] {
            cycle(
                &h,
                IpsetCreate::hash(name, HashIpPortIp, fam),
                vec![
                    IpsetMember::IpPortIp {
                        ip: ip(a),
                        proto: TCP,
                        port: 80,
                        ip2: ip(b),
                    },
                    IpsetMember::IpPortIp {
                        ip: ip(b),
                        proto: UDP,
                        port: 53,
                        ip2: ip(b),
                    },
                ],
                IpsetMember::IpPortIp {
                    ip: ip(a),
                    proto: UDP,
                    port: 80,
                    ip2: ip(b),
                },
            );
        }
        for (name, fam, a, net, cidr) in [
            ("t-ipportnet4", Inet, "10.0.0.1", "10.244.0.0", 16),
            ("t-ipportnet6", Inet6, "fd00::1", "fd00:244::", 64),
        ] {
            cycle(
                &h,
                IpsetCreate::hash(name, HashIpPortNet, fam),
                vec![
                    IpsetMember::IpPortNet {
                        ip: ip(a),
                        proto: TCP,
                        port: 80,
                        net: ip(net),
                        cidr,
                    },
                    IpsetMember::IpPortNet {
                        ip: ip(a),
                        proto: TCP,
                        port: 8080,
                        net: ip(net),
                        cidr: cidr + 8,
                    },
                ],
                IpsetMember::IpPortNet {
                    ip: ip(a),
                    proto: UDP,
                    port: 80,
                    net: ip(net),
                    cidr,
                },
            );
        }
        cycle(
            &h,
            IpsetCreate::hash("t-net4", HashNet, Inet),
            vec![
                IpsetMember::Net {
                    addr: ip("10.0.0.0"),
                    cidr: 8,
                },
                IpsetMember::Net {
                    addr: ip("192.168.1.0"),
                    cidr: 24,
                },
                IpsetMember::Net {
                    addr: ip("172.16.0.1"),
                    cidr: 32,
                },
            ],
            IpsetMember::Net {
                addr: ip("11.0.0.0"),
                cidr: 8,
            },
        );
        cycle(
            &h,
            IpsetCreate::hash("t-net6", HashNet, Inet6),
            vec![
                IpsetMember::Net {
                    addr: ip("fd00::"),
                    cidr: 48,
                },
                IpsetMember::Net {
                    addr: ip("2001:db8::"),
                    cidr: 32,
                },
            ],
            IpsetMember::Net {
                addr: ip("fe80::"),
                cidr: 64,
            },
        );
        cycle(
            &h,
            IpsetCreate::bitmap_port("t-ports", 1000, 2000),
            vec![
                IpsetMember::Port(1000),
                IpsetMember::Port(1500),
                IpsetMember::Port(2000),
            ],
            IpsetMember::Port(1001),
        );
        assert!(h.list_names().unwrap().is_empty());
    });
}

#[test]
fn kernel_ipset_swap_and_errors() {
    in_netns(|| {
        let h = IpsetHandle::new().unwrap();
        let a = IpsetCreate::hash("swap-a", IpsetType::HashIp, IpsetFamily::Inet);
        let b = IpsetCreate::hash("swap-b", IpsetType::HashIp, IpsetFamily::Inet);
        h.create(&a, false).unwrap();
        h.create(&b, false).unwrap();
        h.add("swap-a", &[IpsetMember::Ip(ip("1.1.1.1"))], false)
            .unwrap();
        h.add("swap-b", &[IpsetMember::Ip(ip("2.2.2.2"))], false)
            .unwrap();
        h.swap("swap-a", "swap-b").unwrap();
        assert_eq!(
            h.members("swap-a").unwrap(),
            vec![IpsetMember::Ip(ip("2.2.2.2"))]
        );
        assert_eq!(
            saved_members("swap-b"),
            BTreeSet::from(["1.1.1.1".to_string()])
        );

        // Wrong family member: kernel rejects with an ipset errno, readable text.
        let err = h
            .add("swap-a", &[IpsetMember::Ip(ip("fd00::1"))], false)
            .unwrap_err();
        assert!(err.errno().unwrap() > 4096, "{err}");
        // Missing set.
        let err = h.list("nope").unwrap_err();
        assert!(err.errno().is_some(), "{err}");
        let mut names = h.list_names().unwrap();
        names.sort();
        assert_eq!(names, vec!["swap-a", "swap-b"]);
        // Sets created by the CLI list back too.
        ipset_cli(&["create", "cli-set", "hash:ip,port", "family", "inet"]);
        ipset_cli(&["add", "cli-set", "10.1.2.3,udp:53"]);
        assert_eq!(
            h.members("cli-set").unwrap(),
            vec![IpsetMember::IpPort {
                ip: ip("10.1.2.3"),
                proto: UDP,
                port: 53
            }]
        );
        for n in ["swap-a", "swap-b", "cli-set"] {
            h.destroy(n).unwrap();
        }
    });
}

#[test]
fn kernel_ipset_bulk_10k() {
    in_netns(|| {
        let h = IpsetHandle::new().unwrap();
        let c = IpsetCreate::hash("bulk", IpsetType::HashIpPort, IpsetFamily::Inet);
        h.create(&c, false).unwrap();
        let members: Vec<_> = (0..10_000u32)
            .map(|i| IpsetMember::IpPort {
                ip: IpAddr::V4((0x0a00_0000 + i).into()),
                proto: TCP,
                port: 80 + (i % 7) as u16,
            })
            .collect();
        let batches = adt_batches(&members);
        assert!(
            batches.len() <= 8,
            "10k members in {} messages",
            batches.len()
        );
        h.add("bulk", &members, false).unwrap();
        let l = h.list("bulk").unwrap();
        assert_eq!(l.element_count(), Some(10_000));
        let got: BTreeSet<_> = h.members("bulk").unwrap().into_iter().collect();
        assert_eq!(got, members.iter().cloned().collect());
        assert_eq!(saved_members("bulk").len(), 10_000);
        h.del("bulk", &members[..5000], false).unwrap();
        assert_eq!(h.list("bulk").unwrap().element_count(), Some(5000));
        h.destroy("bulk").unwrap();
    });
}

/// Codec: a hand-built `ipset add test 10.0.0.1,tcp:80` message per ip_set.h.
#[test]
fn codec_add_ip_port_bytes() {
    let m = IpsetMessage::new(
        IPSET_CMD_ADD,
        vec![
            IpsetAttr::Protocol(7),
            IpsetAttr::SetName("test".into()),
            IpsetAttr::Elem(
                IpsetMember::IpPort {
                    ip: ip("10.0.0.1"),
                    proto: TCP,
                    port: 80,
                }
                .to_attrs(),
            ),
        ],
    );
    #[rustfmt::skip]
    let want: &[u8] = &[
        0x02, 0x00, 0x00, 0x00,                         // nfgenmsg: NFPROTO_IPV4, v0, res 0
        0x05, 0x00, 0x01, 0x00, 0x07, 0x00, 0x00, 0x00, // PROTOCOL 7
        0x09, 0x00, 0x02, 0x00, b't', b'e', b's', b't', 0x00, 0x00, 0x00, 0x00, // SETNAME
        0x20, 0x00, 0x07, 0x80,                         // DATA | NLA_F_NESTED, len 32
          0x0c, 0x00, 0x01, 0x80,                       //   IP | NESTED
            0x08, 0x00, 0x01, 0x40, 10, 0, 0, 1,        //     IPADDR_IPV4 | NET_BYTEORDER
          0x06, 0x00, 0x04, 0x40, 0x00, 0x50, 0x00, 0x00, // PORT | NET_BYTEORDER, be16 80
          0x05, 0x00, 0x07, 0x00, 0x06, 0x00, 0x00, 0x00, // PROTO 6
    ];
    let mut b = vec![0u8; m.buffer_len()];
    m.emit(&mut b);
    assert_eq!(b, want);
    assert_eq!(
        IpsetMessage::parse_with_param(want, IPSET_CMD_ADD).unwrap(),
        m
    );
}

/// Codec: the same DATA number parses as a header for CREATE/LIST.
#[test]
fn codec_create_header_roundtrip() {
    let c = IpsetCreate::bitmap_port("ports", 1, 1024);
    let m = IpsetMessage::new(
        IPSET_CMD_CREATE,
        vec![
            IpsetAttr::Protocol(7),
            IpsetAttr::SetName("ports".into()),
            IpsetAttr::TypeName("bitmap:port".into()),
            IpsetAttr::Revision(3),
            IpsetAttr::Family(0),
            IpsetAttr::Header(c.header_attrs()),
        ],
    );
    let mut b = vec![0u8; m.buffer_len()];
    m.emit(&mut b);
    assert_eq!(
        IpsetMessage::parse_with_param(&b[..], IPSET_CMD_CREATE).unwrap(),
        m
    );
}
