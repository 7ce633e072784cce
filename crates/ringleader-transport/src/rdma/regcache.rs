//! A memory-registration cache.
//!
//! Registering memory with an adapter pins its pages and costs tens of
//! microseconds per call, so registrations are kept and reused: a request
//! for a range inside an already registered one is served from the cache;
//! a miss registers the page-aligned range, evicting the least recently
//! used registrations that nobody holds once the cache exceeds its byte
//! budget. Memory that is freed must be [invalidated](RegCache::invalidate)
//! first: a stale registration would otherwise serve a later allocation at
//! the same address with the old pages.
//!
//! Sans-IO: the cache only decides; registering goes through a
//! [`Registrar`] (the `ibverbs` protection domain, or a test double).

use std::io;

/// Registers and deregisters memory (a protection domain).
pub trait Registrar {
    /// What a registration is known by (the memory region).
    type Key: Copy;
    /// Registers `[addr, addr + len)`.
    fn register(&mut self, addr: usize, len: usize) -> io::Result<Self::Key>;
    /// Releases a registration.
    fn deregister(&mut self, key: Self::Key);
}

/// Pages are registered whole.
const PAGE: usize = 4096;

#[derive(Debug)]
struct Entry<K> {
    addr: usize,
    len: usize,
    key: K,
    holds: usize,
    last_use: u64,
}

impl<K> Entry<K> {
    fn covers(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr && addr + len <= self.addr + self.len
    }

    fn overlaps(&self, addr: usize, len: usize) -> bool {
        addr < self.addr + self.len && self.addr < addr + len
    }
}

/// Registrations in use and kept for reuse, within a byte budget.
#[derive(Debug)]
pub struct RegCache<K> {
    entries: Vec<Entry<K>>,
    budget: usize,
    bytes: usize,
    tick: u64,
    /// Registrations made (misses), for tests and statistics.
    pub registrations: u64,
}

impl<K: Copy> RegCache<K> {
    /// An empty cache keeping at most `budget` bytes registered while
    /// nothing holds them.
    pub fn new(budget: usize) -> RegCache<K> {
        RegCache { entries: Vec::new(), budget, bytes: 0, tick: 0, registrations: 0 }
    }

    /// Bytes registered now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A registration covering `[addr, addr + len)`, held until
    /// [`RegCache::release`].
    pub fn acquire<R: Registrar<Key = K>>(&mut self, reg: &mut R, addr: usize, len: usize) -> io::Result<K> {
        self.tick += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.covers(addr, len)) {
            e.holds += 1;
            e.last_use = self.tick;
            return Ok(e.key);
        }
        let start = addr / PAGE * PAGE;
        let end = (addr + len).div_ceil(PAGE) * PAGE;
        self.evict(reg, end - start);
        let key = reg.register(start, end - start)?;
        self.registrations += 1;
        self.bytes += end - start;
        self.entries.push(Entry { addr: start, len: end - start, key, holds: 1, last_use: self.tick });
        Ok(key)
    }

    /// Gives back a registration from [`RegCache::acquire`] for the same range.
    pub fn release(&mut self, addr: usize, len: usize) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.covers(addr, len) && e.holds > 0) {
            e.holds -= 1;
        }
    }

    /// Drops every registration overlapping `[addr, addr + len)` (the
    /// memory is about to be freed). Held ones too: freeing memory still in
    /// use is the caller's bug, and a stale registration would be worse.
    pub fn invalidate<R: Registrar<Key = K>>(&mut self, reg: &mut R, addr: usize, len: usize) {
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].overlaps(addr, len) {
                let e = self.entries.swap_remove(i);
                self.bytes -= e.len;
                reg.deregister(e.key);
            } else {
                i += 1;
            }
        }
    }

    /// Deregisters everything.
    pub fn clear<R: Registrar<Key = K>>(&mut self, reg: &mut R) {
        for e in self.entries.drain(..) {
            reg.deregister(e.key);
        }
        self.bytes = 0;
    }

    /// Evicts unheld entries, least recently used first, until `extra`
    /// more bytes fit in the budget (or nothing more can go).
    fn evict<R: Registrar<Key = K>>(&mut self, reg: &mut R, extra: usize) {
        while self.bytes + extra > self.budget {
            let Some(i) = (0..self.entries.len())
                .filter(|&i| self.entries[i].holds == 0)
                .min_by_key(|&i| self.entries[i].last_use)
            else {
                return;
            };
            let e = self.entries.swap_remove(i);
            self.bytes -= e.len;
            reg.deregister(e.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Fake {
        next: u32,
        live: Vec<(u32, usize, usize)>,
    }

    impl Registrar for Fake {
        type Key = u32;
        fn register(&mut self, addr: usize, len: usize) -> io::Result<u32> {
            self.next += 1;
            self.live.push((self.next, addr, len));
            Ok(self.next)
        }
        fn deregister(&mut self, key: u32) {
            self.live.retain(|(k, _, _)| *k != key);
        }
    }

    #[test]
    fn hits_inside_a_registration_and_page_alignment() {
        let (mut c, mut r) = (RegCache::new(1 << 20), Fake::default());
        let k = c.acquire(&mut r, 4096 + 100, 200).unwrap();
        assert_eq!(r.live, [(k, 4096, 4096)]);
        assert_eq!(c.acquire(&mut r, 4096 + 300, 1000).unwrap(), k);
        assert_eq!(c.registrations, 1);
        let k2 = c.acquire(&mut r, 4096 + 4000, 200).unwrap();
        assert_ne!(k2, k, "crosses the page: a new registration");
        assert_eq!(c.bytes(), 4096 + 8192);
    }

    #[test]
    fn evicts_least_recently_used_unheld_entries_only() {
        let (mut c, mut r) = (RegCache::new(3 * 4096), Fake::default());
        let a = c.acquire(&mut r, 0, 4096).unwrap();
        let b = c.acquire(&mut r, 4096 * 10, 4096).unwrap();
        let x = c.acquire(&mut r, 4096 * 20, 4096).unwrap();
        c.release(0, 4096);
        c.release(4096 * 10, 4096);
        // `a` was used last before `b`: touch it, so `b` is the LRU one.
        c.acquire(&mut r, 0, 10).unwrap();
        c.release(0, 10);
        let d = c.acquire(&mut r, 4096 * 30, 4096).unwrap();
        let live: Vec<u32> = r.live.iter().map(|l| l.0).collect();
        assert!(live.contains(&a) && live.contains(&x) && live.contains(&d) && !live.contains(&b), "{live:?}");
        // Everything held: the budget is exceeded rather than a held entry evicted.
        c.acquire(&mut r, 0, 1).unwrap();
        c.acquire(&mut r, 4096 * 40, 4096).unwrap();
        assert!(c.bytes() > 3 * 4096);
        assert!(r.live.iter().any(|l| l.0 == x));
    }

    #[test]
    fn invalidation_drops_overlapping_registrations() {
        let (mut c, mut r) = (RegCache::new(1 << 20), Fake::default());
        c.acquire(&mut r, 0, 8192).unwrap();
        c.acquire(&mut r, 1 << 16, 4096).unwrap();
        c.invalidate(&mut r, 4096, 1);
        assert_eq!(r.live.len(), 1);
        let again = c.acquire(&mut r, 0, 100).unwrap();
        assert_eq!(c.registrations, 3, "re-registered after invalidation ({again})");
        c.clear(&mut r);
        assert!(r.live.is_empty() && c.bytes() == 0);
    }
}
