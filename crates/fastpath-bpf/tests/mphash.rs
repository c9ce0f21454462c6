//! The BPF ECMP hash (`bpf/lib/mphash.h`, run through
//! `bpf/test/mphash_test.bpf.c` with BPF_PROG_RUN) against the Rust
//! reference `fastpath_core::mphash`, which tests/mphash_kernel.rs in
//! fastpath-core checks against the kernel's own forwarding choices.
//!
//! Needs root (BPF_PROG_RUN); skips without it unless CI=true.
//!
//!   CARGO_TARGET_DIR=/work/tgt-mphash cargo test -p fastpath-bpf --test mphash

use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr};

use fastpath_bpf::skel::mphash_test::MphashTestSkelBuilder;
use fastpath_core::mphash::{custom4, custom6, hash4, hash6, policy2_encap, FIELDS_DEFAULT, FIELDS_INNER};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, ProgramInput};

const CASES: usize = 4000;
const XDP_PASS: u32 = 2;
/// fp_mp_hash*() for a policy other than 0, 1, 2 and 3.
const PUNT: u32 = 0xFFFF_FFFF;

fn have_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("this test needs root (CI=true forbids skipping it)");
    }
    eprintln!("skipping: needs root");
    false
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// splitmix64: reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[derive(Debug)]
struct Input {
    v6: bool,
    policy: u8,
    /// fib_multipath_hash_fields (policy 3's).
    fields: u16,
    proto: u8,
    seed: u32,
    sport: u16,
    dport: u16,
    /// First word of the IPv6 header: version, traffic class, label.
    word0: u32,
    src: [u8; 16],
    dst: [u8; 16],
}

impl Input {
    fn random(rng: &mut Rng) -> Self {
        let r = rng.next();
        let v6 = r & 1 == 1;
        // The four policies fastpath hashes, sometimes an unsupported one
        // (4); now and then a protocol policy 2 would look into. Policy 3
        // with the default fields or any others, inner ones included.
        let policy = [0, 1, 2, 3, 1, 2, 3, 4][(r >> 1) as usize & 7];
        let fields = if (r >> 28) & 3 == 0 { FIELDS_DEFAULT as u16 } else { (r >> 32) as u16 & 0xFFF };
        let proto = match (r >> 4) & 7 {
            0 | 1 => 6,
            2 | 3 => 17,
            4 => [4, 41, 47, 97, 137][(r >> 8) as usize % 5],
            _ => (r >> 8) as u8,
        };
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src[..8].copy_from_slice(&rng.next().to_ne_bytes());
        src[8..].copy_from_slice(&rng.next().to_ne_bytes());
        dst[..8].copy_from_slice(&rng.next().to_ne_bytes());
        dst[8..].copy_from_slice(&rng.next().to_ne_bytes());
        // Equal and near-equal addresses and ports exercise the ordering.
        match (r >> 16) & 7 {
            0 => dst = src,
            1 => dst[..12].copy_from_slice(&src[..12]),
            _ => {}
        }
        let p = rng.next();
        let (sport, mut dport) = (p as u16, (p >> 16) as u16);
        if (r >> 20) & 7 == 0 {
            dport = sport;
        }
        let seed = if (r >> 24) & 7 == 0 { 0 } else { (p >> 32) as u32 };
        Input { v6, policy, fields, proto, seed, sport, dport, word0: rng.next() as u32, src, dst }
    }

    fn frame(&self) -> Vec<u8> {
        let mut f = vec![0u8; 72];
        f[0] = if self.v6 { 6 } else { 4 };
        f[1] = self.policy;
        f[2] = self.proto;
        f[4..8].copy_from_slice(&self.seed.to_ne_bytes());
        f[8..10].copy_from_slice(&self.sport.to_be_bytes());
        f[10..12].copy_from_slice(&self.dport.to_be_bytes());
        f[12..14].copy_from_slice(&self.fields.to_ne_bytes());
        if self.v6 {
            f[14..18].copy_from_slice(&self.word0.to_be_bytes());
            f[22..38].copy_from_slice(&self.src);
            f[38..54].copy_from_slice(&self.dst);
        } else {
            f[26..30].copy_from_slice(&self.src[..4]);
            f[30..34].copy_from_slice(&self.dst[..4]);
        }
        f
    }

    fn reference(&self) -> u32 {
        let p = u32::from(self.policy);
        let f = u32::from(self.fields);
        let (s6, d6) = (Ipv6Addr::from(self.src), Ipv6Addr::from(self.dst));
        let a = |b: &[u8; 16]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        // Policy 3's flow label: the header's 20 bits as a number.
        let label = self.word0 & 0xF_FFFF;
        let h = match (self.v6, p) {
            (true, 3) => custom6(f, self.seed, s6, d6, label, self.proto, self.sport, self.dport),
            (false, 3) => custom4(f, self.seed, a(&self.src), a(&self.dst), self.proto, self.sport, self.dport),
            (true, _) => hash6(p, self.seed, s6, d6, self.word0, self.proto, self.sport, self.dport),
            (false, _) => hash4(p, self.seed, a(&self.src), a(&self.dst), self.proto, self.sport, self.dport),
        };
        h.unwrap_or(PUNT)
    }
}

fn ports_class(proto: u8) -> i32 {
    match proto {
        6 | 17 => 1,
        0 | 33 | 43 | 44 | 50 | 51 | 60 | 132 | 136 | 137 => -1,
        _ => 0,
    }
}

#[test]
fn bpf_matches_reference() {
    if !have_root() {
        return;
    }
    let mut obj = MaybeUninit::<OpenObject>::uninit();
    let open = MphashTestSkelBuilder::default().open(&mut obj).expect("open mphash_test");
    let skel = open.load().expect("load mphash_test (verifier)");
    let mut rng = Rng(0x6270_666d_7068);
    let mut seen = [0usize; 4];
    for i in 0..CASES {
        let input = Input::random(&mut rng);
        let frame = input.frame();
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
        let mut out = vec![0u8; 128];
        let res = skel
            .progs
            .fp_mphash_test
            .test_run(ProgramInput {
                data_in: Some(&frame),
                context_in: Some(&mut ctx),
                data_out: Some(&mut out),
                ..Default::default()
            })
            .expect("BPF_PROG_RUN");
        assert_eq!(res.return_value, XDP_PASS, "case {i}: {input:?}");
        let data = res.data.expect("data out");
        let bpf = u32::from_ne_bytes(data[60..64].try_into().expect("4 bytes"));
        let class = i32::from_ne_bytes(data[64..68].try_into().expect("4 bytes"));
        let asked = i32::from_ne_bytes(data[68..72].try_into().expect("4 bytes"));
        assert_eq!(class, ports_class(input.proto), "case {i}: proto {}", input.proto);
        let inner = input.policy == 2 || (input.policy == 3 && u32::from(input.fields) & FIELDS_INNER != 0);
        if inner && policy2_encap(input.proto) {
            // The data path punts before it hashes (the reference declines).
            assert_eq!((asked, input.reference()), (-1, PUNT), "case {i}: {input:?}");
            seen[usize::from(input.v6) * 2 + 1] += 1;
            continue;
        }
        assert_eq!(bpf, input.reference(), "case {i}: {input:?}");
        let ports = input.fields & 0x30 != 0;
        let want_asked = match input.policy {
            0 => 0,
            1 => ports_class(input.proto),
            2 => 0,
            // Punts what policy 1 punts, asks for ports only when it hashes them.
            3 => ports_class(input.proto).min(if ports { 1 } else { 0 }),
            _ => -1,
        };
        assert_eq!(asked, want_asked, "case {i}: policy {} proto {}", input.policy, input.proto);
        seen[usize::from(input.v6) * 2 + usize::from(input.policy.min(1))] += 1;
    }
    eprintln!("{CASES} cases agree (v4 p0/p1+, v6 p0/p1+: {seen:?})");
}
