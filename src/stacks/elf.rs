//! Function names for native instruction pointers, from an ELF object's
//! symbol table (`.symtab`, else `.dynsym`).
//!
//! `dladdr` alone names only exported symbols, and a program's own
//! functions are not exported: the Rust rank that sleeps in `load_batch`
//! would read `??`. So the object's symbol table is read here, with
//! positioned reads of its section headers, symbols and names only (never
//! the whole file: a shared library can be hundreds of megabytes), and
//! with every size bounded. Parsing is pure ([`Symbols::parse`] over a
//! reader) so that tests feed it the test binary itself.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Largest symbol or string table read (bytes); an object with a larger one
/// is named by `dladdr` alone.
const MAX_TABLE: u64 = 48 << 20;
/// Most section headers read.
const MAX_SECTIONS: u64 = 1 << 16;

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const ET_DYN: u16 = 3;

/// One object's function symbols, sorted by address.
#[derive(Debug, Default)]
pub(crate) struct Symbols {
    /// (address, size, offset of the name in `names`).
    funcs: Vec<(u64, u64, u32)>,
    names: Vec<u8>,
    /// Whether addresses are relative to where the object is loaded (a
    /// shared object or a position-independent executable).
    pub(crate) relative: bool,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads `len` bytes at `offset`, refusing more than [`MAX_TABLE`].
fn read(r: &impl FileExt, offset: u64, len: u64) -> Option<Vec<u8>> {
    if len > MAX_TABLE {
        return None;
    }
    let mut b = vec![0u8; len as usize];
    r.read_exact_at(&mut b, offset).ok()?;
    Some(b)
}

impl Symbols {
    /// Reads the file at `path`; `None` when it is no 64-bit little-endian
    /// ELF object or holds no usable symbol table.
    pub(crate) fn load(path: &str) -> Option<Symbols> {
        Symbols::parse(&File::open(path).ok()?)
    }

    /// Parses an ELF object through positioned reads.
    pub(crate) fn parse(r: &impl FileExt) -> Option<Symbols> {
        let hdr = read(r, 0, 64)?;
        // 64-bit (class 2), little-endian (data 1).
        if hdr.get(..4)? != b"\x7fELF" || hdr[4] != 2 || hdr[5] != 1 {
            return None;
        }
        let e_type = u16_at(&hdr, 16)?;
        let shoff = u64_at(&hdr, 0x28)?;
        let shentsize = u16_at(&hdr, 0x3a)? as u64;
        let shnum = u16_at(&hdr, 0x3c)? as u64;
        if shentsize < 64 || shnum == 0 || shnum > MAX_SECTIONS {
            return None;
        }
        let sh = read(r, shoff, shentsize.checked_mul(shnum)?)?;
        let section = |i: u64| -> Option<(u32, u64, u64, u32, u64)> {
            let at = (i * shentsize) as usize;
            Some((
                u32_at(&sh, at + 4)?,
                u64_at(&sh, at + 0x18)?,
                u64_at(&sh, at + 0x20)?,
                u32_at(&sh, at + 0x28)?,
                u64_at(&sh, at + 0x38)?,
            ))
        };
        let find = |kind: u32| (0..shnum).find(|&i| section(i).is_some_and(|s| s.0 == kind));
        let table = find(SHT_SYMTAB).or_else(|| find(SHT_DYNSYM))?;
        let (_, off, size, link, entsize) = section(table)?;
        let (_, str_off, str_size, _, _) = section(link as u64)?;
        if entsize < 24 {
            return None;
        }
        let syms = read(r, off, size)?;
        let names = read(r, str_off, str_size)?;
        let mut funcs = Vec::new();
        for at in (0..syms.len() / entsize as usize).map(|i| i * entsize as usize) {
            let (Some(name), Some(&info), Some(value), Some(size)) =
                (u32_at(&syms, at), syms.get(at + 4), u64_at(&syms, at + 8), u64_at(&syms, at + 16))
            else {
                break;
            };
            if info & 0xf == STT_FUNC && value != 0 {
                funcs.push((value, size, name));
            }
        }
        funcs.sort_unstable();
        Some(Symbols { funcs, names, relative: e_type == ET_DYN })
    }

    /// The function holding address `addr` (an address as the object's
    /// symbol table counts them).
    pub(crate) fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.funcs.partition_point(|f| f.0 <= addr).checked_sub(1)?;
        let (value, size, name) = self.funcs[i];
        if addr >= value.saturating_add(size.max(1)) {
            return None;
        }
        let tail = self.names.get(name as usize..)?;
        let end = tail.iter().position(|&c| c == 0)?;
        std::str::from_utf8(&tail[..end]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_of_this_test() -> usize {
        a_function_of_this_test as *const () as usize
    }

    #[test]
    fn names_a_function_of_this_very_binary() {
        let syms = Symbols::load("/proc/self/exe").expect("the test binary is ELF with symbols");
        let addr = a_function_of_this_test() as u64;
        // Where the binary was loaded, from /proc/self/maps: its first
        // mapping starts at the load base (offset 0).
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let base = maps
            .lines()
            .find(|l| l.ends_with(exe.to_str().unwrap()))
            .and_then(|l| u64::from_str_radix(l.split('-').next().unwrap(), 16).ok())
            .unwrap();
        let at = if syms.relative { addr - base } else { addr };
        let name = syms.lookup(at + 1).expect("found");
        assert!(crate_demangle(name).ends_with("a_function_of_this_test"), "{name} -> {}", crate_demangle(name));
    }

    fn crate_demangle(s: &str) -> String {
        ringleader_diag::stacks::demangle(s)
    }

    #[test]
    fn refuses_what_is_not_elf() {
        let f = std::fs::File::open("/proc/self/cmdline").unwrap();
        assert!(Symbols::parse(&f).is_none());
        let f = std::fs::File::open("Cargo.toml").unwrap();
        assert!(Symbols::parse(&f).is_none());
        assert!(Symbols::default().lookup(5).is_none());
    }
}
