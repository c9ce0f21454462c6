//! Compiles every `bpf/*.bpf.c` (and `bpf/{bench,test}/*.bpf.c`) into a libbpf-rs
//! skeleton, turns `bpf/include/fastpath.h` into Rust types with bindgen, and
//! derives the reason names from the header so Rust never hand-copies them.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use libbpf_cargo::SkeletonBuilder;

fn main() {
    // A build script fails by panicking; the message carries the whole chain.
    if let Err(e) = run() {
        panic!("{e:#}");
    }
}

/// The paths of a directory's entries, sorted so builds are reproducible.
fn entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    paths.sort();
    Ok(paths)
}

fn write(path: PathBuf, text: impl AsRef<[u8]>) -> Result<()> {
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

fn run() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR unset")?);
    let root = manifest.join("../..");
    let root = root.canonicalize().with_context(|| format!("resolving {}", root.display()))?;
    let bpf = root.join("bpf");
    let out = PathBuf::from(env::var("OUT_DIR").context("OUT_DIR unset")?);
    let clang = env::var("FASTPATH_CLANG").unwrap_or_else(|_| "clang-19".into());
    println!("cargo:rerun-if-env-changed=FASTPATH_CLANG");

    let include = bpf.join("include");
    let lib = bpf.join("lib");
    for dir in [&include, &lib] {
        println!("cargo:rerun-if-changed={}", dir.display());
        for e in entries(dir)? {
            println!("cargo:rerun-if-changed={}", e.display());
        }
    }

    let mut skels = String::new();
    for dir in [bpf.clone(), bpf.join("bench"), bpf.join("test")] {
        println!("cargo:rerun-if-changed={}", dir.display());
        for src in entries(&dir)? {
            let Some(stem) = src.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".bpf.c")) else {
                continue;
            };
            println!("cargo:rerun-if-changed={}", src.display());
            let skel = out.join(format!("{stem}.skel.rs"));
            SkeletonBuilder::new()
                .source(&src)
                .obj(out.join(format!("{stem}.bpf.o")))
                .clang(&clang)
                .clang_args([
                    "-O2",
                    "-g",
                    "-Wall",
                    "-Werror",
                    // v3 (ALU32, JMP32; kernels >= 5.1): clang-19 still defaults to v1.
                    "-mcpu=v3",
                    "-D__TARGET_ARCH_x86",
                    &format!("-I{}", include.display()),
                    &format!("-I{}", lib.display()),
                ])
                .build_and_generate(&skel)
                .with_context(|| format!("building {} with {clang}", src.display()))?;
            skels.push_str(&format!(
                "pub mod {stem} {{ include!(concat!(env!(\"OUT_DIR\"), \"/{stem}.skel.rs\")); }}\n"
            ));
        }
    }
    write(out.join("skels.rs"), skels)?;

    let header = include.join("fastpath.h");
    bindgen::Builder::default()
        .header_contents("wrapper.h", &format!("#include <linux/types.h>\n#include \"{}\"\n", header.display()))
        .allowlist_type("fp_.*")
        .allowlist_var("FP_.*")
        .rustified_enum("fp_reason")
        .rustified_enum("fp_route_type")
        // Array indices (fp_stats.flow, .hash_src) and table values: plain consts.
        .constified_enum_module("fp_flow_event")
        .constified_enum_module("fp_hash_src")
        .constified_enum_module("fp_group_kind")
        .derive_default(true)
        .derive_eq(true)
        .generate()
        .with_context(|| format!("bindgen {}", header.display()))?
        .write_to_file(out.join("intf.rs"))
        .context("writing intf.rs")?;

    write(out.join("reason_names.rs"), reason_names(&header)?)
}

/// `FP_R_NOT_IP` -> "not_ip", in enum order, straight from the header.
fn reason_names(header: &Path) -> Result<String> {
    let text = fs::read_to_string(header).with_context(|| format!("reading {}", header.display()))?;
    let body = text
        .split_once("enum fp_reason {")
        .and_then(|(_, rest)| rest.split_once("};"))
        .map(|(body, _)| body)
        .ok_or_else(|| anyhow!("{}: no `enum fp_reason {{ ... }};`", header.display()))?;
    let mut names = Vec::new();
    for line in body.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("FP_R_") {
            let ident: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if ident != "_COUNT" {
                names.push(format!("{:?}", ident.to_lowercase()));
            }
        }
    }
    Ok(format!("/// Reason names in `enum fp_reason` order.\npub const REASON_NAMES: &[&str] = &[{}];\n", names.join(", ")))
}
