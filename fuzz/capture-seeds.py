#!/usr/bin/env python3
"""Capture seed inputs for the netlink fuzz targets from the running kernel.

Run as root inside a throwaway network namespace, from the repository root:

    unshare -n python3 fuzz/capture-seeds.py

It builds a small nf_tables table, ipsets, conntrack entries, a dummy link with
addresses (with `nft`, `ipset`, `conntrack`, `ip`), dumps them over raw netlink
sockets and writes each reply message's payload (the bytes after `nlmsghdr`) to
`fuzz/corpus/<target>/kernel-*`. IPVS seeds come from the golden bytes in
`netlink/tests/ipvs_codec.rs` (no IPVS on the capture host).
"""

import hashlib
import os
import socket
import struct
import subprocess

CORPUS = "fuzz/corpus"
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3

NFT = """
table ip fuzz {
  set vips {
    type ipv4_addr
    elements = { 10.96.0.1, 10.96.0.10 }
  }
  set eps {
    type ipv4_addr . inet_proto . inet_service
    flags timeout
    timeout 1h
    elements = { 10.244.0.5 . tcp . 8080 comment "ns/svc:http", 10.244.0.6 . udp . 53 }
  }
  set marks {
    type mark
    elements = { 0x4000 }
  }
  map natmap {
    type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
    elements = { 10.96.0.2 . tcp . 80 : 10.244.0.5 . 8080 }
  }
  chain svc_a {
    ip saddr 10.244.0.0/16 counter meta mark set mark or 0x4000 comment "ns/a:https"
  }
  chain svc_b {
    numgen random mod 2 vmap { 0 : jump svc_a, 1 : drop }
  }
  map svcs {
    type ipv4_addr . inet_proto . inet_service : verdict
    elements = { 10.96.0.1 . tcp . 443 : goto svc_a, 10.96.0.10 . udp . 53 : jump svc_b }
  }
  chain nat-prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr . meta l4proto . th dport vmap @svcs comment "services"
  }
  chain filter-input {
    type filter hook input priority -110; policy accept;
    ct state new ip daddr @vips reject
  }
}
table ip6 fuzz6 {
  set vips6 {
    type ipv6_addr
    elements = { fd00::1, 2001:db8::a }
  }
  chain out {
    type filter hook output priority 0; policy accept;
    ip6 daddr @vips6 accept
  }
}
"""


def sh(*argv):
    subprocess.run(argv, check=True)


def save(target, data, prefix=b""):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    blob = prefix + data
    name = "kernel-" + hashlib.sha1(blob).hexdigest()[:12]
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob)


def nla(kind, value):
    n = 4 + len(value)
    return struct.pack("=HH", n, kind) + value + b"\0" * ((4 - n % 4) % 4)


def dump(proto, msg_type, payload, flags=NLM_F_DUMP):
    """Replies up to the ack or NLMSG_DONE: a list of (datagram, [(type, payload)])."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)
    s.settimeout(5)
    s.bind((0, 0))
    s.send(struct.pack("=LHHLL", 16 + len(payload), msg_type,
                       NLM_F_REQUEST | flags, 1, 0) + payload)
    out = []
    while True:
        dgram = s.recv(1 << 20)
        msgs, off, done = [], 0, False
        while off + 16 <= len(dgram):
            length, t, _flags, _seq, _pid = struct.unpack_from("=LHHLL", dgram, off)
            if t in (NLMSG_ERROR, NLMSG_DONE):
                done = True
            else:
                msgs.append((t, dgram[off + 16:off + length]))
            off += (length + 3) & ~3
        out.append((dgram, msgs))
        if done:
            return out


def nfgen(family):
    return struct.pack("=BBH", family, 0, 0)


def capture_nft():
    subprocess.run(["nft", "-f", "-"], input=NFT.encode(), check=True)
    kinds = {0: "nft_table", 3: "nft_chain", 6: "nft_rule", 9: "nft_set", 12: "nft_setelem"}
    for family, table, sets in [(2, b"fuzz", [b"vips", b"eps", b"marks", b"svcs", b"natmap"]),
                                (10, b"fuzz6", [b"vips6"])]:
        reqs = [(1, b""), (4, b""), (7, b""), (10, b"")]
        reqs += [(13, nla(1, table + b"\0") + nla(2, s + b"\0")) for s in sets]
        for get, attrs in reqs:
            for dgram, msgs in dump(12, (10 << 8) | get, nfgen(family) + attrs):
                if msgs and len(dgram) < 8192:
                    save("nft_datagram", dgram)
                for t, p in msgs:
                    if (t >> 8) == 10 and (t & 0xFF) in kinds:
                        save(kinds[t & 0xFF], p)
    for dgram, msgs in dump(12, (10 << 8) | 16, nfgen(0), NLM_F_ACK):
        save("nft_datagram", dgram)


def capture_ipset():
    sh("ipset", "create", "fz-ip", "hash:ip", "timeout", "300")
    sh("ipset", "add", "fz-ip", "10.0.0.1", "timeout", "60")
    sh("ipset", "create", "fz-ipport", "hash:ip,port")
    sh("ipset", "add", "fz-ipport", "10.0.0.2,tcp:80")
    sh("ipset", "add", "fz-ipport", "10.0.0.3,udp:53")
    sh("ipset", "create", "fz-ipportip", "hash:ip,port,ip")
    sh("ipset", "add", "fz-ipportip", "10.0.0.2,tcp:80,10.0.0.2")
    sh("ipset", "create", "fz-net", "hash:net", "family", "inet6")
    sh("ipset", "add", "fz-net", "fd00::/64")
    sh("ipset", "create", "fz-ports", "bitmap:port", "range", "0-65535")
    sh("ipset", "add", "fz-ports", "30080")
    proto = nla(1, b"\x07")
    for cmd, flags in [(7, NLM_F_DUMP), (1, NLM_F_ACK)]:
        for _dgram, msgs in dump(12, (6 << 8) | cmd, nfgen(2) + proto, flags):
            for t, p in msgs:
                save("ipset", p, bytes([t & 0xFF]))


def capture_conntrack():
    sh("conntrack", "-I", "-p", "udp", "-s", "10.0.0.1", "-d", "10.96.0.10", "--sport", "5353",
       "--dport", "53", "-r", "10.244.0.5", "-q", "10.0.0.1", "--reply-port-src", "53",
       "--reply-port-dst", "5353", "-t", "60", "-u", "SEEN_REPLY")
    sh("conntrack", "-I", "-p", "tcp", "-s", "10.0.0.1", "-d", "10.96.0.1", "--sport", "40000",
       "--dport", "443", "-t", "60", "--state", "ESTABLISHED", "-u", "ASSURED", "-w", "7")
    sh("conntrack", "-I", "-p", "udp", "-s", "fd00::1", "-d", "fd00::2",
       "--sport", "1", "--dport", "2", "-t", "60")
    for family in (2, 10):
        for _dgram, msgs in dump(12, (1 << 8) | 1, nfgen(family)):
            for t, p in msgs:
                save("ctnetlink", p)


def capture_rtnl():
    sh("ip", "link", "set", "lo", "up")
    # No dummy driver on the capture host: a veth pair has IFLA_LINKINFO too.
    sh("ip", "link", "add", "fz0", "type", "veth", "peer", "name", "fz1")
    sh("ip", "addr", "add", "10.96.0.1/32", "dev", "fz0")
    sh("ip", "addr", "add", "fd00::1/128", "dev", "fz0")
    for _dgram, msgs in dump(0, 18, struct.pack("=BxHiII", 0, 0, 0, 0, 0)):
        for t, p in msgs:
            save("rtnl_link", p)
    for _dgram, msgs in dump(0, 22, struct.pack("=BBBBI", 0, 0, 0, 0, 0)):
        for t, p in msgs:
            save("rtnl_addr", p)


if __name__ == "__main__":
    for target in os.listdir(CORPUS):
        for f in os.listdir(os.path.join(CORPUS, target)):
            if f.startswith("kernel-"):
                os.remove(os.path.join(CORPUS, target, f))
    capture_rtnl()
    capture_nft()
    capture_ipset()
    capture_conntrack()
