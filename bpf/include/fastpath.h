/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * fastpath.h — the one interface between the BPF data plane and Rust.
 *
 * Everything that crosses the boundary (verdict/punt reasons, map keys and
 * values, runtime switches) is declared here once. Rust gets it through
 * bindgen (crates/fastpath-bpf/build.rs), never by hand-copying; the build
 * script also derives the reason names from the `FP_R_*` enumerators below,
 * so adding a reason here is all it takes to see it in `fastpath status`.
 *
 * Byte order: addresses are stored in network order exactly as they appear
 * in the packet; every other integer is host order.
 */
#ifndef FASTPATH_H
#define FASTPATH_H

/*
 * Why a packet got the verdict it got. FP_R_FORWARDED is the only reason a
 * packet leaves through the fast path; every other one means XDP_PASS (the
 * kernel takes it, unmodified). Keep FP_R__COUNT last.
 */
enum fp_reason {
	FP_R_FORWARDED = 0,        /* redirected out of a managed interface */
	FP_R_NOT_IP,               /* ethertype other than IPv4/IPv6 (ARP, LLDP, ...) */
	FP_R_VLAN,                 /* 802.1Q/802.1ad tagged frame */
	FP_R_L2_OTHER_HOST,        /* unicast frame for a MAC that is not the ingress port's */
	FP_R_MULTICAST,            /* L2 or L3 multicast/broadcast, broadcast route */
	FP_R_MALFORMED,            /* truncated, bad version/IHL/length/header checksum */
	FP_R_IP_OPTIONS,           /* IPv4 header longer than 20 bytes */
	FP_R_FRAGMENT,             /* IPv4 MF set or fragment offset != 0 */
	FP_R_IPV6_EXT_HDR,         /* IPv6 next header is an extension header */
	FP_R_TTL_EXCEEDED,         /* TTL / hop limit <= 1: the kernel sends Time Exceeded */
	FP_R_LINK_LOCAL,           /* 169.254/16 or fe80::/10 source or destination */
	FP_R_MARTIAN,              /* source or destination the kernel treats as martian */
	FP_R_FORWARDING_DISABLED,  /* forwarding sysctl off for this family on the ingress */
	FP_R_RP_FILTER,            /* reverse-path check failed or not decidable here */
	FP_R_POLICY_ROUTING,       /* non-default ip rules for this family: kernel decides */
	FP_R_TABLE_FULL,           /* a route did not fit: its nearest installed cover (or itself) punts */
	FP_R_LOCAL,                /* destination is this host (local/anycast route) */
	FP_R_NO_ROUTE,             /* no FIB entry */
	FP_R_BLACKHOLE,            /* blackhole route: the kernel drops */
	FP_R_UNREACHABLE,          /* unreachable route: the kernel answers ICMP */
	FP_R_PROHIBIT,             /* prohibit route: the kernel answers ICMP */
	FP_R_ROUTE_UNSUPPORTED,    /* throw, lwtunnel encap, TOS-specific, dead next hop, ... */
	FP_R_ECMP,                 /* multipath route whose hash we cannot reproduce (policy, seed, protocol) */
	FP_R_NO_NEIGH,             /* neighbour missing or not in a usable NUD state */
	FP_R_EGRESS_NOT_MANAGED,   /* egress interface has no fastpath program / devmap slot */
	FP_R_EGRESS_DOWN,          /* egress interface not running, or not for this family now */
	FP_R_MTU,                  /* packet larger than the egress/route MTU */
	FP_R_SAME_IFACE,           /* egress == ingress: the kernel may send a redirect */
	FP_R_INGRESS_UNKNOWN,      /* program runs on an interface missing from fp_ifaces */
	FP_R_REDIRECT_FAILED,      /* bpf_redirect_map() refused the egress */
	FP_R_ICMP_ERROR_ECMP,      /* ICMP error over a multipath route: the kernel hashes its inner header */
	/* Stateful mode (fp_config.stateful): conntrack decides. */
	FP_R_CT_NEW,               /* no conntrack entry: a new connection, the kernel sets it up */
	FP_R_CT_NOT_ESTABLISHED,   /* entry unconfirmed, dying, no reply seen, TCP not ESTABLISHED, UDP not assured */
	FP_R_CT_UNMARKED,          /* entry lacks the fast-path ct mark bits the ruleset sets */
	FP_R_CT_TCP_FLAGS,         /* TCP SYN, FIN or RST: conntrack must see set-up and teardown */
	FP_R_CT_UNSUPPORTED,       /* protocol the conntrack kfuncs cannot look up, short L4 header, helper/expected flow, zone */
	FP_R_CT_NAT,               /* NAT the fast path does not perform */
	FP_R_ORPHANED,             /* no daemon heartbeat for fp_runtime.orphan_grace seconds: tables may be stale */
	FP_R_TC_INGRESS,           /* the ingress port has tc filters or tcx programs the kernel must run */
	FP_R_TC_EGRESS,            /* the egress port has a qdisc, filters or tcx programs only the kernel's path runs */
	FP_R_MULTI_BUFFER,         /* the frame spans several XDP buffers (a jumbo frame): the kernel forwards it */
	FP_R_EGRESS_PEER_NOT_READY,/* the egress is a veth whose peer would drop XDP frames (no XDP program, no GRO) */
	FP_R__COUNT
};

/*
 * Flow cache events, counted per ingress slot (fp_stats.flow). A packet is
 * either a HIT or a MISS; STALE, EXPIRED and EVICT say more about a miss:
 * STALE = the key was cached but from an older table generation,
 * EXPIRED = the key was cached but idle longer than the timeout,
 * EVICT = filling the cache pushed out another live flow.
 * BYPASS (neither hit nor miss) = the packet went past the cache to the full
 * lookup without a look, as the cache was thrashing (struct fp_flow_guard).
 */
enum fp_flow_event {
	FP_FC_HIT = 0,
	FP_FC_MISS,
	FP_FC_STALE,
	FP_FC_EXPIRED,
	FP_FC_EVICT,
	FP_FC_BYPASS,
	FP_FC__COUNT
};

/* Where a packet's flow hash came from (fp_stats.hash_src). */
enum fp_hash_src {
	FP_HS_SOFTWARE = 0,      /* computed by the program */
	FP_HS_META,              /* struct fp_rx_hint in data_meta, left by an upstream program */
	FP_HS_NIC,               /* bpf_xdp_metadata_rx_hash() in the device-bound variant */
	FP_HS__COUNT
};

/* fp_route.type: what the FIB says about a destination. */
enum fp_route_type {
	FP_RT_FORWARD = 1,   /* unicast via fp_route.nh_id */
	FP_RT_LOCAL,         /* delivered to this host */
	FP_RT_BLACKHOLE,
	FP_RT_UNREACHABLE,
	FP_RT_PROHIBIT,
	FP_RT_PUNT,          /* pass up with fp_route.punt_reason */
	FP_RT_MULTIPATH,     /* ECMP: fp_route.nh_id is an fp_groups index */
};

/* fp_iface.flags */
#define FP_IF_UP          (1U << 0)  /* IFF_UP and carrier (IFF_RUNNING) */
#define FP_IF_FWD4        (1U << 1)  /* net.ipv4.conf.<dev>.forwarding */
#define FP_IF_FWD6        (1U << 2)  /* net.ipv6.conf.{all,<dev>}.forwarding */
#define FP_IF_RPF_STRICT  (1U << 3)  /* effective rp_filter == 1 */
#define FP_IF_RPF_LOOSE   (1U << 4)  /* effective rp_filter == 2 */

#define FP_IF_PRESENT     (1U << 5)  /* slot in use (fp_ifaces is an array: absent = all zero) */
/* tc policy the data path would skip (the daemon's tcpolicy.rs): */
#define FP_IF_TC_INGRESS  (1U << 6)  /* tc ingress filters or tcx ingress programs: arrivals go to the kernel */
#define FP_IF_TC_EGRESS   (1U << 7)  /* a shaping/classifying qdisc, egress filters or tcx: never sent out by XDP */
/* A veth whose peer cannot take redirected frames (the daemon's vethpeer.rs): */
#define FP_IF_PEER_NO_XDP (1U << 8)  /* the peer runs no NAPI (no XDP program, GRO off) or could not be checked */
/* Written ahead of a recompute, never derived from kernel state (the recompute clears it): */
#define FP_IF_V4_FLUSH    (1U << 9)  /* lost its last IPv4 address: the kernel flushes its IPv4 routes unannounced */
/* From kernel state, but unlike the bits above one that forbids: */
#define FP_IF_V6_OFF      (1U << 10) /* net.ipv6.conf.<dev>.disable_ipv6: ip6_output() drops what leaves by it */

/* Family bits for fp_runtime switches. */
#define FP_FAM_V4 (1U << 0)
#define FP_FAM_V6 (1U << 1)

#ifndef FP_ETH_ALEN
#define FP_ETH_ALEN 6
#endif

/*
 * fp_ifaces: array indexed by slot -> one managed interface (ingress flags,
 * egress rewrite data). Slot 0 is never used: it counts unknown ingress.
 */
struct fp_iface {
	__u8  mac[FP_ETH_ALEN];  /* our MAC: expected destination on ingress, source on egress */
	__u16 flags;             /* FP_IF_*; 0 = slot unused */
	__u32 mtu;               /* IPv4 egress MTU (device MTU) */
	__u32 mtu6;              /* IPv6 egress MTU (net.ipv6.conf.<dev>.mtu) */
	__u32 ifindex;           /* the device in this slot */
};

/*
 * Per program instance, set before load (.rodata): each managed interface
 * gets its own instance, so the ingress needs no lookup by ifindex.
 */
struct fp_config {
	__u32 ingress_ifindex;   /* the device this instance is attached to */
	__u32 ingress_slot;      /* its fp_ifaces / fp_stats slot */
	__u32 flow_sets;         /* fp_flows sets per CPU, a power of two; 0 = no cache */
	/*
	 * 1 when this device's RX hash of L4 type is what the kernel itself
	 * would take as skb->hash (a real NIC; not veth, whose rx_hash is a
	 * software hash computed on demand): then, with multipath hash policy 1,
	 * ECMP uses it as fib_multipath_hash() does (skb->l4_hash short-cut).
	 */
	__u32 nic_hash_is_skb_hash;
	/*
	 * 1 = fp_xdp_fwd_hw asks the driver for the RX hash. 0 on a virtual
	 * device (veth), where that "RX hash" is skb_get_hash(): a software
	 * hash computed by the call and stored in the skb, whose l4_hash bit
	 * fib_multipath_hash() then short-cuts on for a frame we punt. Asking
	 * there costs a call per packet, gains nothing over our own hash, and
	 * would change the kernel's own ECMP choice for punted frames.
	 */
	__u32 nic_rx_hash;
	/* 1 = stateful mode: forward only conntrack entries that are established and carry fp_runtime.ct_mark. */
	__u32 stateful;
	/* 1 = AF_XDP data path: what would be forwarded goes to user space (fp_xsks), see struct fp_xsk_meta. */
	__u32 afxdp;
	/*
	 * 1 = `--flow-key addresses`: TCP and UDP flows are cached by address
	 * pair, as other protocols are (one entry for all connections between
	 * two hosts), except in a family whose multipath hash policy is 1,
	 * where the kernel's path choice depends on the ports (fp_flow_ports()).
	 * Stateless mode only: a conntrack verdict is per connection.
	 */
	__u32 flow_key_addrs;
	/* 1 = `--fib4-index dir24`: IPv4 FIB lookups read fp_fib4_dir first (fp_fib4_lookup()). */
	__u32 fib4_dir;
	/*
	 * `--fib6-index multibit`: fp_fib6_dir's bucket count (a power of two);
	 * IPv6 FIB lookups walk fp_fib6_dir16/fp_fib6_dir first (fp_fib6_lookup()).
	 * 0 = trie only.
	 */
	__u32 fib6_dir;
};

/*
 * fp_fib4_dir: the /24 index in front of fp_fib4 (fp_config.fib4_dir;
 * crates/fastpath-core/src/dir24.rs keeps it). One entry per /24 block,
 * FP_DIR24_PER_ELEM to an array element (an array stores every value in 8-byte
 * steps: one u16 each would take four times the memory): FP_DIR24_TRIE asks
 * fp_fib4 (a route longer than /24 lies in the block, or the entry was never
 * written), FP_DIR24_NONE says no route, anything else is the fp_fib4_vals
 * index of the block's longest covering route's value.
 */
#define FP_DIR24_TRIE      0
#define FP_DIR24_NONE      0xFFFF
#define FP_DIR24_PER_ELEM  32
#define FP_DIR24_ELEMS     ((1U << 24) / FP_DIR24_PER_ELEM)
#define FP_DIR24_VALS      0xFFFF   /* fp_fib4_vals entries; slot 0 unused */
/*
 * fp_fib4_dir16, the first level: one entry per /16, the value all its
 * blocks agree on, else FP_DIR16_DESCEND (read the block). 128 KiB, so with
 * a small table it stays in cache where the blocks' 32 MiB would not.
 */
#define FP_DIR16_DESCEND   0
#define FP_DIR16_ELEMS     ((1U << 16) / FP_DIR24_PER_ELEM)

struct fp_dir24_elem {
	__u16 entry[FP_DIR24_PER_ELEM];
};

/*
 * The IPv6 multibit index in front of fp_fib6 (fp_config.fib6_dir;
 * crates/fastpath-core/src/dir6.rs keeps it). fp_fib6_dir16 holds one word
 * per /16: an entry (low 32 bits) and the version of the /16's hash entries
 * (high 32), written in one store. An entry is FP_DIR6_TRIE (ask fp_fib6),
 * VAL(slot) (the fp_fib6_vals slot of the answer; FP_DIR6_NONE: no route)
 * or DESCEND(level, default): look up the address's block at that level
 * in fp_fib6_dir, and if it has no entry the answer is the default. Slot
 * FP_DIR6_INHERIT below the first level means the /16's own slot.
 */
#define FP_DIR6_TRIE       0
#define FP_DIR6_VAL        1
#define FP_DIR6_DESCEND    2
#define FP_DIR6_NONE       0
#define FP_DIR6_INHERIT    0xFFFF
#define FP_DIR6_VALS       0xFFFF   /* fp_fib6_vals entries; slot 0 unused */
#define FP_DIR6_TOPS       (1U << 16)
#define FP_DIR6_HOPS       6        /* hash levels: /24, /32, ... /64 */

/*
 * fp_fib6_dir: the index's entries in a two-choice hash table of 64-byte
 * buckets (fp_config.fib6_dir of them, a power of two). A key (the
 * address's upper 64 bits masked to the level, host order; the level; its
 * /16's version) lives in one of the two buckets fp_dir6_hash() names, in
 * a slot whose tag is version << 8 | level (0: empty).
 */
#define FP_DIR6_WAYS       4
#define FP_DIR6_VER_MASK   0xFFFFFF

struct fp_dir6_slot {
	__u64 hi;
	__u32 tag;
	__u32 entry;
};

struct fp_dir6_bucket {
	struct fp_dir6_slot s[FP_DIR6_WAYS];
};

/* fp_fib4 key: LPM trie, prefixlen first as the trie requires. */
struct fp_lpm4_key {
	__u32 prefixlen;
	__u32 addr;              /* network order */
};

/* fp_fib6 key */
struct fp_lpm6_key {
	__u32 prefixlen;
	__u8  addr[16];
};

/* fp_fib4 / fp_fib6 value */
struct fp_route {
	__u8  type;              /* enum fp_route_type */
	__u8  punt_reason;       /* enum fp_reason, for FP_RT_PUNT */
	__u16 _pad;
	__u32 mtu;               /* route MTU metric honoured when forwarding (0 = none) */
	__u32 nh_id;             /* FP_RT_FORWARD: fp_nexthops index; FP_RT_MULTIPATH: fp_groups index */
};

/* fp_nexthops: array indexed by nh_id (0 is never used). */
struct fp_nexthop {
	__u32 ifindex;           /* egress */
	__u8  gw_family;         /* 0 = on-link (neighbour is the packet's destination), AF_INET, AF_INET6 */
	__u8  _pad;
	__u16 slot;              /* egress fp_ifaces slot, 0 = interface not managed */
	__u8  gw[16];            /* gateway, network order; IPv4 in the first 4 bytes */
};

/*
 * Neighbour keys: the L2 table of one interface (split L2/L3, FreeBSD
 * paper), one map per address family so the IPv4 key is 8 bytes. The map
 * follows the neighbour's family (gateway family, else the packet's), so
 * IPv4 via an IPv6 gateway looks in fp_neigh6.
 */
struct fp_neigh4_key {           /* fp_neigh4 */
	__u32 ifindex;
	__u32 addr;              /* network order */
};

struct fp_neigh6_key {           /* fp_neigh6 */
	__u32 ifindex;
	__u8  addr[16];
};

/*
 * fp_neigh4 / fp_neigh6 value: only neighbours in a usable NUD state are present.
 * used: fp_runtime.neigh_clock when a packet last went out to it. The data
 * path stores it only when it differs (about once per tick per neighbour),
 * so the common case is a compare on the cache line already read for the
 * MAC; the daemon never writes it back (a hash update would recycle the
 * element under a concurrent reader), it only reads it for the keep-alive.
 */
struct fp_neigh {
	__u8  mac[FP_ETH_ALEN];
	__u16 _pad;
	__u32 used;              /* neigh_clock of the last use, 0 = never */
};

/*
 * ECMP (FP_RT_MULTIPATH): fp_groups, array indexed by group id (0 unused).
 * Hash-threshold groups (classic multipath routes, `ip nexthop group`
 * type mpath) pick the first path whose upper_bound >= hash, as
 * fib_select_multipath() / nexthop_select_path_hthr() do; the daemon
 * computes the bounds as the kernel's rebalance does (dead paths get -1).
 * Resilient groups pick fp_res_buckets[(group << 16) | hash % n_buckets];
 * their paths list the members (upper_bound unused), so that a cached flow
 * can tell whether its next hop is still one of them.
 */
#define FP_GROUP_MAX_PATHS 64

enum fp_group_kind {
	FP_GRP_HASH_THRESHOLD = 1,
	FP_GRP_RESILIENT,
};

struct fp_group_path {
	__s32 upper_bound;       /* hash-threshold: last hash value of this path */
	__u32 nh_id;             /* fp_nexthops index */
};

struct fp_group {
	__u8  kind;              /* enum fp_group_kind */
	__u8  n_paths;           /* entries used in paths[] */
	__u16 n_buckets;         /* resilient: bucket count (kernel: u16) */
	__u32 _pad;
	struct fp_group_path paths[FP_GROUP_MAX_PATHS];
};

/*
 * Kernel-compatible multipath hash settings (fib_multipath_hash_policy per
 * family, fib_multipath_hash_seed), in fp_runtime. Only policies 0 (L3) and
 * 1 (L4) are implemented; the daemon punts multipath routes of a family
 * with any other policy, and of both families while the seed is the
 * kernel's random one (user seed 0), which cannot be reproduced.
 */

/*
 * Flow cache: fp_flows holds fp_config.flow_sets sets per CPU, indexed by
 * the flow hash modulo flow_sets in the CPU's own slice; each set holds
 * FP_FLOW_WAYS flows. A set is one cache line of per-way bookkeeping
 * followed by one line per way (the map keeps sets line-aligned, see
 * maps.h). The whole key must match, so a hash collision can never return
 * another flow's result.
 *
 * An IPv6 hit reads two lines: the ways' tags (the flow hash) in the first
 * are compared, then only a matching way's key. An IPv4 key packs into 16
 * bytes (struct fp_flow_key4), so an IPv4 way carries its own generation,
 * used and packets, and in stateful mode its conntrack verdict, in the rest
 * of the line (struct fp_flow_way4) and a fill puts it in its
 * home way (hash bits 28-29) when that way is free: most IPv4 hits read that
 * one line and never the set's first, which halves the cache's footprint
 * with many flows. The first line's tag, generation and used are written for
 * IPv4 ways too (at fill and once per clock tick), for the victim choice and
 * for a way found away from home by its tag.
 *
 * A way is only trusted while its generation equals fp_runtime.generation
 * (low 32 bits: a false match would need 2^32 table changes within one idle
 * timeout) and it was used within fp_runtime.flow_timeout.
 */
#define FP_FLOW_WAYS 4

/*
 * 5-tuple for TCP/UDP; ICMP/ICMPv6 type and code in sport (an error must
 * never share an echo's entry); ports 0 for other protocols (address pair:
 * the source matters to rp_filter and to the ECMP hash). The IPv6 flow
 * label is part of the key because the kernel's L3 multipath hash uses it.
 * Compared as five u64 words and one u32.
 */
struct fp_flow_key {
	__u8  family;            /* FP_AF_INET / FP_AF_INET6 */
	__u8  proto;             /* IP protocol / IPv6 next header */
	__u16 ingress;           /* ingress slot: rp_filter, forwarding and same-interface depend on it */
	__u16 sport;             /* network order */
	__u16 dport;             /* network order */
	__u32 flowlabel;         /* IPv6 flow label, network order (0 for IPv4) */
	__u8  saddr[16];         /* IPv4 in the first 4 bytes, rest 0 */
	__u8  daddr[16];
};

/* One cached flow: exactly one cache line. */
struct fp_flow_way {
	struct fp_flow_key key;
	__u32 nh_id;             /* next hop it goes through (ECMP stickiness, keep-alive, `fastpath flows`) */
	__u8  dmac[FP_ETH_ALEN]; /* next hop's MAC */
	__u8  smac[FP_ETH_ALEN]; /* egress MAC */
	__u16 slot;              /* egress slot (fp_tx_ports key) */
	__u16 mtu;               /* largest IP datagram that may go out (route, device) */
};

/*
 * A cached conntrack verdict's per-packet part (stateful mode; see
 * fp_ct_way): in an IPv4 way's own line, so that an IPv4 hit reads one line
 * and no conntrack lookup; for IPv6 in fp_ct_flows. Trusted while
 * ct_generation equals fp_runtime.ct_generation and it was validated less
 * than fp_runtime.ct_revalidate_ms ago. state holds the tick of that
 * validation (the coarse clock in 2^20 ns, ~1.05 ms, steps; 30 bits, so it
 * wraps after ~13 days, which is why --ct-revalidate-ms is capped at
 * FP_CT_REVALIDATE_MAX_MS) above two FP_CTH_* flag bits; tick 0 = not
 * validated.
 */
#define FP_CT_TICK_SHIFT 20
#define FP_CT_TICK_MASK 0x3FFFFFFFU
#define FP_CT_REVALIDATE_MAX_MS 600000
#define FP_CTH_FLAG_BITS 2
#define FP_CTH_CLOSING (1U << 0) /* a TCP FIN/RST of this flow went to the kernel under ct_generation:
				  * punt without a lookup until the generation moves (the kernel may not
				  * have processed it yet, so conntrack can still say ESTABLISHED, and the
				  * segments after it are conntrack's to see) */
#define FP_CTH_NAT     (1U << 1) /* the flow is NATed: its fp_nat is in fp_ct_flows */

struct fp_ct_hot {
	__u64 bytes;             /* IP bytes (as conntrack counts them) forwarded on this CPU since filled */
	__u32 ct_generation;     /* fp_runtime.ct_generation at the last conntrack lookup */
	__u32 state;             /* tick of that lookup << FP_CTH_FLAG_BITS | FP_CTH_* */
};

/* The IPv4 key of a way: struct fp_flow_key without the IPv6-only parts. */
struct fp_flow_key4 {
	__u8  family;            /* FP_AF_INET */
	__u8  proto;
	__u16 ingress;
	__u16 sport;
	__u16 dport;
	__u32 saddr;             /* network order */
	__u32 daddr;
};

/*
 * An IPv4 way: the same line, its packed key first (family first, as in
 * every way: an IPv6 key never matches one), then its conntrack verdict and
 * its own bookkeeping where an IPv6 key has its addresses.
 */
struct fp_flow_way4 {
	struct fp_flow_key4 key;
	struct fp_ct_hot ct;     /* stateful mode; zero otherwise */
	__u32 generation;        /* as fp_flow_set.generation, authoritative for IPv4 */
	__u32 used;              /* as fp_flow_set.used, authoritative for IPv4 */
	__u32 packets;           /* as fp_flow_set.packets (which stays 0 for IPv4) */
	__u32 nh_id;
	__u8  dmac[FP_ETH_ALEN];
	__u8  smac[FP_ETH_ALEN];
	__u16 slot;
	__u16 mtu;
};

struct fp_flow_set {
	__u32 tag[FP_FLOW_WAYS];         /* flow hash of the way's flow */
	__u32 generation[FP_FLOW_WAYS];  /* fp_runtime.generation (low 32 bits) it was computed from; 0 = empty */
	__u32 used[FP_FLOW_WAYS];        /* fp_runtime.neigh_clock of the last hit */
	__u32 packets[FP_FLOW_WAYS];     /* packets through it on this CPU since it was filled (IPv6) */
	struct fp_flow_way way[FP_FLOW_WAYS];
};

/*
 * What an upstream XDP program (a NIC emulation, the bench generator) may
 * leave in the metadata area just before the packet: the NIC's flow hash.
 * Taken only when the metadata area is exactly this size and the magic
 * matches.
 */
#define FP_HINT_MAGIC 0xF1A5
#define FP_HINT_L4    (1U << 0)  /* hash covers the L4 ports (RSS L4 type) */

struct fp_rx_hint {
	__u32 hash;
	__u16 flags;             /* FP_HINT_* */
	__u16 magic;             /* FP_HINT_MAGIC */
};

/*
 * The coarse clock of one jiffy (watchdog.h's fp_coarse_ns(), for the
 * watchdog and conntrack revalidation), per CPU and ingress slot. Lives in
 * fp_stats because every packet already has its entry at hand: a zeroed
 * entry (counter reset) just reads the clock again.
 */
struct fp_watch {
	__u64 jiffies;           /* bpf_jiffies64() when now_ns was read */
	__u64 now_ns;            /* bpf_ktime_get_coarse_ns() in that jiffy */
	/* fp_orphaned() last found the tables kept in jiffy kept_jiffies, with
	 * neigh_clock | orphan_grace << 32 = kept_rt (fp_kept_this_jiffy()). */
	__u64 kept_jiffies;
	__u64 kept_rt;
};

/*
 * When far more flows are live than the cache holds (a flood of new flows,
 * a scan), nearly every lookup misses and finds its set full of other live
 * flows: the lookup and the fill are two memory misses that buy nothing,
 * and the cache makes forwarding slower than no cache. Judged per window of
 * FP_FLOW_GUARD_WINDOW lookups: when more than half of them missed into a
 * full set, about one packet in FP_FLOW_GUARD_SAMPLE looks the cache up (and
 * may fill it) until a window of those sampled lookups says otherwise; the
 * gaps between samples are random, so a flood that repeats with a period
 * (a round-robin scan) does not sample the same flows every time. Each
 * further crowded window in a row doubles the gap, up to one packet in
 * FP_FLOW_GUARD_SAMPLE << FP_FLOW_GUARD_DEEPEN: a sampled lookup in a
 * thrashing cache is two memory misses and a fill that buy nothing, so a
 * long flood pays for fewer of them, and a window that is not crowded
 * still ends the bypass at once (later, in packets, the sparser it got). Misses
 * into free or idle ways (a cache warming up) never count. The bypass sent
 * flows by the full lookup, i.e. by the path the hash picks; once any flow
 * of this slot may have been kept off that path (a flow cached before an
 * ECMP group changed keeping its next hop, `sticky`), entries last used
 * before the latest bypass began are
 * recomputed rather than hit (a stale one keeps no ECMP path in any case),
 * so no flow returns to where it was before. Not a counter; per CPU and
 * ingress slot like the rest of fp_stats.
 */
struct fp_flow_guard {
	__u32 left;              /* lookups left in this window; 0 = none yet */
	__u32 crowded;           /* misses this window that found no free way */
	__u32 skip;              /* packets still to send past the cache */
	__u32 bypass;            /* crowded windows in a row, up to FP_FLOW_GUARD_DEEPEN + 1 (0: none): sample */
	__u32 since;             /* fp_runtime.neigh_clock when the latest bypass began; 0 = none */
	__u32 sticky;            /* a flow cached before a group change kept its next hop (never cleared) */
	__u32 rand;              /* xorshift32 state for sampling and admission (0: not seeded yet) */
	__u32 _pad;
};

#define FP_FLOW_GUARD_WINDOW 256
#define FP_FLOW_GUARD_SAMPLE 16
#define FP_FLOW_GUARD_DEEPEN 4   /* sparsest sampling: one packet in 16 << 4 = 256 */

/* fp_stats: per-CPU array indexed by fp_iface.slot (ingress interface). */
struct fp_stats {
	__u64 packets[FP_R__COUNT];
	__u64 bytes[FP_R__COUNT];
	__u64 flow[FP_FC__COUNT];        /* enum fp_flow_event */
	__u64 hash_src[FP_HS__COUNT];    /* enum fp_hash_src, per hashed packet */
	struct fp_watch watch;           /* not a counter: watchdog.h's clock memo */
	struct fp_flow_guard guard;      /* not a counter: flow cache bypass state */
};

/*
 * Runtime switches, the whole of the program's .bss. The daemon writes it as
 * one value (key 0 of the .bss array map) after each reconcile.
 */
struct fp_runtime {
	__u64 generation;        /* bumped on every table change */
	__u32 table_full;        /* FP_FAM_*: family punted because a table overflowed */
	__u32 policy_punt;       /* FP_FAM_*: family punted because of non-default ip rules */
	/*
	 * FP_FAM_V4: validate sources with rp_filter off by an LPM lookup
	 * instead of the fp_src_deny4 hash, because the FIB holds a
	 * non-forwarding prefix shorter than /32 that the hash cannot cover
	 * (or the hash would overflow). See fp_ip4_rpf_reason().
	 */
	__u32 src_lpm;
	/*
	 * Keep-alive clock: CLOCK_MONOTONIC_COARSE seconds + 1, advanced by
	 * the daemon's keep-alive (~1/s). 0 before the first tick: packets then
 * stamp `used` = 0, which reads as "never" (no keep-alive is owed yet).
	 */
	__u32 neigh_clock;
	__u32 flow_timeout;      /* seconds a cached flow may stay idle; 0 = flow cache off */
	__u8  mp_policy4;        /* net.ipv4.fib_multipath_hash_policy (0 to 3) */
	__u8  mp_policy6;        /* net.ipv6.fib_multipath_hash_policy (0 to 3) */
	__u16 _pad;
	__u32 mp_seed;           /* net.ipv4.fib_multipath_hash_seed (user seed, non-zero) */
	/* Stateful mode (fp_config.stateful); ignored otherwise. */
	__u32 ct_mark;           /* ct mark bits an entry must carry (all of them) for its original direction to be fast-pathed */
	__u32 ct_generation;     /* bumped by the daemon on conntrack/ruleset events that may revoke a verdict */
	__u32 ct_revalidate_ms;  /* a cached verdict is re-checked against conntrack at least this often */
	__u32 ct_timeout_tcp;    /* seconds: net.netfilter.nf_conntrack_tcp_timeout_established */
	__u32 ct_timeout_udp;    /* seconds: nf_conntrack_udp_timeout (reply seen, not assured) */
	__u32 ct_timeout_udp_stream; /* seconds: nf_conntrack_udp_timeout_stream (assured) */
	/*
	 * Watchdog: once neigh_clock (the daemon's heartbeat) is more than
	 * this many seconds behind CLOCK_MONOTONIC_COARSE, every packet is
	 * punted (FP_R_ORPHANED): a dead daemon must degrade to plain kernel
	 * forwarding, never to forwarding by tables nobody keeps current.
	 * 0 = watchdog off.
	 */
	__u32 orphan_grace;
	/*
	 * Stateful mode: net.netfilter.nf_conntrack_tcp_be_liberal is on in
	 * the netns, so conntrack's TCP window tracking accepts what it missed
	 * for every entry; otherwise a TCP entry must carry the per-direction
	 * "be liberal" flag (set by the daemon) before the fast path may carry
	 * segments conntrack will never see.
	 */
	__u32 ct_tcp_liberal;
	/*
	 * generation (low 32 bits) from which the multipath hash settings
	 * (mp_policy4/6, mp_fields4/6, mp_seed) hold. A stale cached flow keeps its ECMP
	 * path only if it was cached under them: the path stays when the
	 * group changes, but a new hash policy or seed moves flows as it
	 * moves them in the kernel.
	 */
	__u32 mp_generation;
	/*
	 * Stateful mode: the bits an entry must carry for its reply
	 * direction. A ruleset decides per packet, so per direction: one bit
	 * for both would let the replies a ruleset accepts vouch for the
	 * other direction's packets it drops.
	 */
	__u32 ct_mark_reply;
	/*
	 * generation (low 32 bits) from which the ECMP groups (paths, bounds,
	 * resilient buckets) hold, written before the first group write of a
	 * change. A stale cached flow computed before it and keeping its
	 * next hop may be off the path the hash now picks, which the thrash
	 * guard must know (fp_flow_guard.sticky).
	 */
	__u32 group_generation;
	/* net.ipv{4,6}.fib_multipath_hash_fields: what policy 3 hashes. */
	__u32 mp_fields4;
	__u32 mp_fields6;
};

/*
 * What a NATed flow's packets become (stateful mode), read from the
 * conntrack entry: for a packet in direction d, the tuple of the other
 * direction reversed. Addresses and ports in network order; IPv4 in the
 * first 4 bytes.
 */
#define FP_NAT_SRC (1U << 0)     /* source address/port change (SNAT, masquerade) */
#define FP_NAT_DST (1U << 1)     /* destination address/port change (DNAT) */

struct fp_nat {
	__u8  saddr[16];
	__u8  daddr[16];
	__u16 sport;
	__u16 dport;
	__u32 flags;             /* FP_NAT_* */
};

/*
 * fp_ct_flows (stateful mode): per-CPU array parallel to fp_flows, same set
 * index, same way. Holds what a cached flow's conntrack verdict does not
 * keep in its way: the whole verdict of an IPv6 flow (its way's line is
 * full), the NAT of any NATed flow (FP_CTH_NAT). A hit of an IPv4 flow
 * without NAT never reads it. Only a forward verdict is ever cached; an
 * invalid one makes the next packet look conntrack up again (and refresh
 * the entry's timeout). Exactly one cache line per way.
 */
struct fp_ct_way {
	struct fp_ct_hot hot;    /* IPv6 flows (an IPv4 flow's is in its way) */
	struct fp_nat nat;       /* what the packets of this flow become (when FP_CTH_NAT) */
	__u8  _pad[8];
};

struct fp_ct_set {
	struct fp_ct_way way[FP_FLOW_WAYS];
};

/*
 * fp_ct_icmp (stateful mode): the daemon's copy of conntrack's ICMP and
 * ICMPv6 echo entries, which the conntrack kfuncs cannot look up (TCP and
 * UDP only). Key: an echo packet's own tuple as a struct fp_flow_key
 * (proto ICMP or ICMPv6 matching the family; sport = type and code as on
 * the wire, dport = echo id; ingress and flowlabel 0), one key per
 * direction of an entry. The daemon writes both from a ctnetlink GET when
 * the data path asks (fp_ct_icmp_req) and again every half
 * revalidation interval while packets look at them (`used`); the data path trusts a
 * copy for ct_revalidate_ms after its GET, like a cached verdict.
 */
#define FP_DEFAULT_CT_ICMP_ENTRIES 8192     /* keys: two per echo entry (--ct-icmp-entries 4096) */

struct fp_ct_icmp {
	__u64 checked;           /* CLOCK_MONOTONIC_COARSE ns (bpf_ktime_get_coarse_ns()) of the GET */
	__u64 used;              /* written by the data path: last packet that looked at this copy while current */
	__u32 reason;            /* FP_R_FORWARDED, or why conntrack's entry keeps this direction slow */
	__u32 _pad;
	struct fp_nat nat;       /* this direction's rewrite (flags 0: none) */
};

/*
 * fp_src_bloom4: a bitmap in front of fp_src_deny4, so that the common
 * source (not denied) costs an array read instead of a hash lookup. Bit
 * (addr * FP_SRC_BLOOM_MUL) >> (32 - FP_SRC_BLOOM_BITS), with addr the
 * network-order address read as a host u32, is set for every address in
 * fp_src_deny4: set before the entry is added, cleared after the last
 * entry on it is deleted. Bit b lives in word b / 64, bit b % 64.
 */
#define FP_SRC_BLOOM_BITS  16
#define FP_SRC_BLOOM_WORDS (1U << (FP_SRC_BLOOM_BITS - 6))
#define FP_SRC_BLOOM_MUL   0x9E3779B1U

/* Default capacities (overridable at start, see `fastpath run --help`). */
#define FP_DEFAULT_FIB4_ENTRIES    65536
#define FP_DEFAULT_FIB6_ENTRIES    16384
#define FP_DEFAULT_NEXTHOP_ENTRIES 4096
#define FP_DEFAULT_NEIGH_ENTRIES   16384
#define FP_DEFAULT_GROUP_ENTRIES   1024
#define FP_DEFAULT_RES_BUCKETS     65536    /* resilient buckets, all groups together */
#define FP_DEFAULT_FLOW_ENTRIES    32768    /* per CPU (2.6 MB); rounded up to FP_FLOW_WAYS * 2^n */
#define FP_DEFAULT_FLOW_TIMEOUT    30
#define FP_DEFAULT_CT_MARK         0x1      /* original direction */
#define FP_DEFAULT_CT_MARK_REPLY   0x2      /* reply direction */
#define FP_DEFAULT_CT_REVALIDATE_MS 1000
#define FP_MAX_IFACES              256
#define FP_DEFAULT_ORPHAN_GRACE    30       /* seconds without a daemon heartbeat before everything is punted */

/*
 * AF_XDP data path (`fastpath run --datapath afxdp`). The program still
 * decides punt vs forward (a punt must reach the kernel unmodified, which
 * user space cannot do), but instead of rewriting and redirecting to the
 * devmap it redirects the untouched frame into fp_xsks with this pushed in
 * front of it (bpf_xdp_adjust_head: the descriptor starts with it, the
 * frame follows; xsk.h says why not the metadata area). User space parses the
 * frame, checks it against this, rewrites (MACs, TTL/hop limit, checksum,
 * padding) and transmits it on its socket of the egress slot.
 * fp_xsks key: slot * FP_XSK_MAX_QUEUES + RX queue index.
 */
#define FP_XSK_MAX_QUEUES   16
#define FP_XSK_FRAME_SIZE   4096     /* UMEM chunk */
#define FP_XSK_HEADROOM     256      /* XDP_PACKET_HEADROOM the kernel keeps in front of a copied frame */
#define FP_XSK_MAX_FRAME    (FP_XSK_FRAME_SIZE - FP_XSK_HEADROOM)  /* larger frames are punted */
#define FP_XSK_META_MAGIC   0xfa57c0deU

struct fp_xsk_meta {
	__u8  dmac[FP_ETH_ALEN]; /* the neighbour's MAC */
	__u8  smac[FP_ETH_ALEN]; /* the egress port's MAC */
	__u16 egress_slot;       /* fp_ifaces slot to transmit on */
	__u16 family;            /* FP_AF_INET / FP_AF_INET6 (parse.h values) */
	__u32 magic;             /* FP_XSK_META_MAGIC */
};

/* ---- DNS responders (bpf/bench/dns_*.bpf.c, `fastpath bench dns`) ---- */
#define FP_DNS_KEY_NAME 64   /* wire-format name bytes in a key; longer names are never records */
#define FP_DNS_ANS_MAX  112  /* answer RR bytes per key: four AAAA RRs or seven A RRs */
#define FP_DNS_QTYPE_NAME 0  /* key qtype of a name's "exists" marker (NODATA, not NXDOMAIN) */

/* dns_records key: the question's name in wire format, lowercased, zero
 * padded, and its QTYPE in host order. */
struct fp_dns_key {
	__u8 name[FP_DNS_KEY_NAME];
	__u16 qtype;
	__u16 pad;
};

/* The answer section to append after the question, in wire format; names
 * are the compression pointer 0xc00c (the question's name). */
struct fp_dns_answer {
	__u16 ancount;
	__u16 len;
	__u8 rr[FP_DNS_ANS_MAX];
};

/* Per-CPU counters of the DNS responders (dns_stats), by outcome. */
#define FP_DNS_C_ANSWER   0   /* NOERROR with records */
#define FP_DNS_C_NODATA   1   /* NOERROR, name exists, no record of that type */
#define FP_DNS_C_NXDOMAIN 2
#define FP_DNS_C_FORMERR  3
#define FP_DNS_C_NOTIMP   4   /* opcode other than QUERY */
#define FP_DNS_C_REFUSED  5   /* class other than IN */
#define FP_DNS_C_DROP     6   /* no answer: truncated header, QR set, oversized, source port 0 */
#define FP_DNS_C_PASS     7   /* not a DNS query for the responder: left to the kernel */
#define FP_DNS_C_PUNT     8   /* a query whose answer does not fit the buffer's tailroom: left to the kernel */
#define FP_DNS_C__COUNT   9
/* ---- end DNS responders ---- */

#endif /* FASTPATH_H */
