//! ctnetlink's ABI numbers (include/uapi/linux/netfilter/nfnetlink.h,
//! nfnetlink_conntrack.h, nf_conntrack_common.h, nf_conntrack_tcp.h), in
//! one place for the modules that speak it: ctwatch (events, mark clears),
//! ctliberal (window flags), cticmp (ICMP echo entries).

// Address families (nfgenmsg) and protocols.
pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;
pub const IPPROTO_TCP: u8 = 6;

// Subsystems, message types, multicast groups.
pub const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const IPCTNL_MSG_CT_NEW: u16 = 0;
pub const IPCTNL_MSG_CT_GET: u16 = 1;
pub const IPCTNL_MSG_CT_DELETE: u16 = 2;
pub const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
pub const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;
pub const NFNLGRP_NFTABLES: u32 = 7;

// Attribute type flags.
pub const NLA_TYPE_MASK: u16 = 0x3fff;
pub const NLA_F_NESTED: u16 = 0x8000;

// A conntrack message's attributes (enum ctattr_type).
pub const CTA_TUPLE_ORIG: u16 = 1;
pub const CTA_TUPLE_REPLY: u16 = 2;
pub const CTA_STATUS: u16 = 3;
pub const CTA_PROTOINFO: u16 = 4;
pub const CTA_HELP: u16 = 5;
pub const CTA_TIMEOUT: u16 = 7;
pub const CTA_MARK: u16 = 8;
pub const CTA_TUPLE_MASTER: u16 = 14;
pub const CTA_ZONE: u16 = 18;
pub const CTA_MARK_MASK: u16 = 21;

// Inside a tuple (enum ctattr_tuple), its IP part (ctattr_ip) and its
// protocol part (ctattr_l4proto).
pub const CTA_TUPLE_IP: u16 = 1;
pub const CTA_TUPLE_PROTO: u16 = 2;
pub const CTA_IP_V4_SRC: u16 = 1;
pub const CTA_IP_V4_DST: u16 = 2;
pub const CTA_IP_V6_SRC: u16 = 3;
pub const CTA_IP_V6_DST: u16 = 4;
pub const CTA_PROTO_NUM: u16 = 1;
pub const CTA_PROTO_SRC_PORT: u16 = 2;
pub const CTA_PROTO_DST_PORT: u16 = 3;
pub const CTA_PROTO_ICMP_ID: u16 = 4;
pub const CTA_PROTO_ICMP_TYPE: u16 = 5;
pub const CTA_PROTO_ICMP_CODE: u16 = 6;
pub const CTA_PROTO_ICMPV6_ID: u16 = 7;
pub const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
pub const CTA_PROTO_ICMPV6_CODE: u16 = 9;

// Inside CTA_PROTOINFO (ctattr_protoinfo, ctattr_protoinfo_tcp).
pub const CTA_PROTOINFO_TCP: u16 = 1;
pub const CTA_PROTOINFO_TCP_STATE: u16 = 1;
pub const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
pub const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;
pub const IP_CT_TCP_FLAG_BE_LIBERAL: u8 = 0x08;
pub const TCP_CONNTRACK_ESTABLISHED: u8 = 3;

// Entry status bits (enum ip_conntrack_status).
pub const IPS_EXPECTED: u32 = 1 << 0;
pub const IPS_SEEN_REPLY: u32 = 1 << 1;
pub const IPS_CONFIRMED: u32 = 1 << 3;
pub const IPS_SRC_NAT: u32 = 1 << 4;
pub const IPS_DST_NAT: u32 = 1 << 5;
pub const IPS_SEQ_ADJUST: u32 = 1 << 6;
pub const IPS_DYING: u32 = 1 << 9;
pub const IPS_FIXED_TIMEOUT: u32 = 1 << 10;
pub const IPS_HELPER: u32 = 1 << 13;
pub const IPS_OFFLOAD: u32 = 1 << 14;
pub const IPS_HW_OFFLOAD: u32 = 1 << 15;
