//! Which hosts a script may reach: its step's `allowed_hosts` rules, and the address check
//! that keeps loopback, private and every other special-purpose address behind the
//! operator's approval (a workspace's provider `base_url` too).
//!
//! The special-purpose ranges are one table per IP version, copied from IANA's registries
//! with each entry's name and RFC, so a reader can check it line by line against them.
//! Not std's `IpAddr::is_global`, which is still unstable, nor a crate: the table is
//! short, adds no dependency, and judges the IPv6 forms that carry an IPv4 address by the
//! address they reach, which is the rule here.

use super::*;

/// One entry of a step's `allowed_hosts`: a host name or IP address, with a port or
/// any port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRule {
    host: String,
    port: Option<u16>,
}

impl HostRule {
    /// `api.example.com`, `api.example.com:8443`, `127.0.0.1`, `[::1]:80`; no scheme,
    /// path or user name.
    pub fn parse(entry: &str) -> Result<HostRule, String> {
        let entry = entry.trim();
        let bad = || {
            format!(
                "`{entry}` is not a host: give a host name or IP address, optionally with                  :port (no scheme, path or user name)"
            )
        };
        if entry.is_empty() || entry.contains(['/', '@', '?', '#', ' ']) {
            return Err(bad());
        }
        let uri: Uri = format!("http://{entry}").parse().map_err(|_| bad())?;
        let authority = uri.authority().ok_or_else(bad)?;
        let port = match authority.as_str().strip_prefix(authority.host()) {
            Some("") => None,
            Some(rest) => Some(
                rest.strip_prefix(':')
                    .and_then(|p| p.parse::<u16>().ok())
                    .ok_or_else(bad)?,
            ),
            None => return Err(bad()),
        };
        Ok(HostRule {
            host: normal_host(authority.host()),
            port,
        })
    }

    /// The host (compared form) and port of the rule: for the fuzz targets.
    #[doc(hidden)]
    pub fn parts(&self) -> (&str, Option<u16>) {
        (&self.host, self.port)
    }

    pub(crate) fn matches(&self, origin: &Origin) -> bool {
        self.host == normal_host(&origin.host) && self.port.is_none_or(|p| p == origin.port)
    }
}

/// A host as compared: lower case, without the brackets of an IPv6 address or the dot
/// that ends a fully qualified name.
pub(crate) fn normal_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// The IP address a host names without a lookup: an address as Rust reads it, else an IPv4
/// address in a form the C library's `inet_aton` reads (`127.1`, `2130706433`, `0x7f.1`,
/// `0177.0.0.1`), which a connection made by name reaches as that address.
pub(crate) fn ip_of(host: &str) -> Option<std::net::IpAddr> {
    let host = normal_host(host);
    host.parse::<std::net::IpAddr>()
        .ok()
        .or_else(|| inet_aton(&host).map(std::net::IpAddr::V4))
}

/// `host` read as `inet_aton` reads it: one to four parts, each decimal, octal (a leading
/// `0`) or hex (`0x`), the last filling the bytes the others leave. `None` when it is not
/// such a number (a name).
fn inet_aton(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) = match part.strip_prefix("0x").or(part.strip_prefix("0X")) {
            Some(hex) => (hex, 16),
            None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
            None => (*part, 10),
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        let value = u32::from_str_radix(digits, radix).ok()?;
        values.push(value);
    }
    let (last, leading) = values.split_last()?;
    if leading.iter().any(|&v| v > 255) {
        return None;
    }
    let last_bits = 8 * (4 - leading.len() as u32);
    if last_bits < 32 && *last >> last_bits != 0 {
        return None;
    }
    let high = leading
        .iter()
        .enumerate()
        .fold(0u32, |acc, (i, &v)| acc | (v << (24 - 8 * i)));
    Some(std::net::Ipv4Addr::from(high | last))
}

/// Whether `host` is this machine's loopback in any spelling: `localhost` (any case, a
/// final dot), an address in 127.0.0.0/8 however written (`127.1`, `0x7f.1`), `::1`, or
/// 127.0.0.0/8 mapped into IPv6 (`::ffff:127.0.0.1`), with or without brackets. The one
/// judgment of the provider rules, the `--allow-host` checks and the HTTP clients that
/// leave an environment proxy out for loopback.
pub fn is_loopback_host(host: &str) -> bool {
    if normal_host(host) == "localhost" {
        return true;
    }
    match ip_of(host) {
        Some(std::net::IpAddr::V4(v4)) => v4.is_loopback(),
        Some(std::net::IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        None => false,
    }
}

/// One range of a special-purpose registry: its first address, prefix length and name.
type Special<T> = (T, u8, &'static str);

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8, name: &'static str) -> Special<u32> {
    (u32::from_be_bytes([a, b, c, d]), len, name)
}

/// The IPv4 ranges that are not on the public internet: the entries of the IANA IPv4
/// Special-Purpose Address Registry (RFC 6890,
/// iana.org/assignments/iana-ipv4-special-registry) that are not globally reachable,
/// with multicast (its own registry) beside them. An entry marked globally reachable
/// (AS112, AMT, 192.175.48.0/24) is left out; 192.0.0.0/24 is refused whole, its two
/// anycast addresses (192.0.0.9, 192.0.0.10) with it.
const SPECIAL_V4: &[Special<u32>] = &[
    v4(0, 0, 0, 0, 8, "\"this network\", RFC 791"),
    v4(10, 0, 0, 0, 8, "private use, RFC 1918"),
    v4(100, 64, 0, 0, 10, "shared address space, RFC 6598"),
    v4(127, 0, 0, 0, 8, "loopback, RFC 1122"),
    v4(169, 254, 0, 0, 16, "link local, RFC 3927"),
    v4(172, 16, 0, 0, 12, "private use, RFC 1918"),
    v4(192, 0, 0, 0, 24, "IETF protocol assignments, RFC 6890"),
    v4(192, 0, 2, 0, 24, "documentation, TEST-NET-1, RFC 5737"),
    v4(192, 88, 99, 0, 24, "6to4 relay anycast, RFC 7526"),
    v4(192, 168, 0, 0, 16, "private use, RFC 1918"),
    v4(198, 18, 0, 0, 15, "benchmarking, RFC 2544"),
    v4(198, 51, 100, 0, 24, "documentation, TEST-NET-2, RFC 5737"),
    v4(203, 0, 113, 0, 24, "documentation, TEST-NET-3, RFC 5737"),
    v4(224, 0, 0, 0, 4, "multicast, RFC 5771"),
    // Before 240.0.0.0/4, which holds it: the first range that holds an address names it.
    v4(255, 255, 255, 255, 32, "limited broadcast, RFC 919"),
    v4(240, 0, 0, 0, 4, "reserved, RFC 1112"),
];

const fn v6(segments: [u16; 8], len: u8, name: &'static str) -> Special<u128> {
    let mut bits = 0u128;
    let mut i = 0;
    while i < 8 {
        bits = (bits << 16) | segments[i] as u128;
        i += 1;
    }
    (bits, len, name)
}

/// The IPv6 ranges that are not on the public internet: the entries of the IANA IPv6
/// Special-Purpose Address Registry (RFC 6890,
/// iana.org/assignments/iana-ipv6-special-registry) that are not globally reachable,
/// with multicast (its own registry) and the deprecated site-local fec0::/10 beside them.
/// The forms that carry an IPv4 address are not here: [`embedded_v4`] judges them by it.
/// 2001::/23 is refused whole (Teredo, ORCHID and the rest), its few globally reachable
/// entries with it: a provider or script has no business there.
const SPECIAL_V6: &[Special<u128>] = &[
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified, RFC 4291"),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback, RFC 4291"),
    v6(
        [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
        48,
        "local-use IPv4/IPv6 translation, RFC 8215",
    ),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard only, RFC 6666"),
    v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64, "dummy prefix, RFC 9780"),
    v6(
        [0x2001, 0, 0, 0, 0, 0, 0, 0],
        23,
        "IETF protocol assignments, RFC 2928",
    ),
    v6(
        [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
        32,
        "documentation, RFC 3849",
    ),
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4, RFC 3056"),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation, RFC 9637"),
    v6(
        [0x5f00, 0, 0, 0, 0, 0, 0, 0],
        16,
        "segment routing SIDs, RFC 9602",
    ),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local, RFC 4193"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link local, RFC 4291"),
    v6(
        [0xfec0, 0, 0, 0, 0, 0, 0, 0],
        10,
        "site local, deprecated, RFC 3879",
    ),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast, RFC 4291"),
];

/// Whether `bits` lies in `range` (of an address `width` bits wide).
fn within(bits: u128, width: u32, &(first, len, _): &Special<u128>) -> bool {
    let shift = width - u32::from(len);
    shift >= width || (bits >> shift) == (first >> shift)
}

/// The IPv4 address an IPv6 one stands for: IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
/// `::a.b.c.d` (deprecated; `::` and `::1` are their own entries), IPv4-translated
/// `::ffff:0:a.b.c.d` (RFC 2765) and the NAT64 well-known prefix `64:ff9b::a.b.c.d`
/// (RFC 6052). A network that routes one of these reaches that IPv4 address.
fn embedded_v4(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let s = v6.segments();
    let carried = matches!(
        s[..6],
        [0, 0, 0, 0, 0, 0xffff] | [0, 0, 0, 0, 0xffff, 0] | [0x64, 0xff9b, 0, 0, 0, 0]
    ) || (s[..6] == [0; 6] && u128::from(v6) > 1);
    carried.then(|| {
        let [.., a, b, c, d] = v6.octets();
        std::net::Ipv4Addr::new(a, b, c, d)
    })
}

/// The special-purpose range `ip` lies in (its name, for messages), or `None` for an
/// address on the public internet. An IPv6 address that carries an IPv4 one
/// ([`embedded_v4`]) is judged as that IPv4 address.
pub(crate) fn special_range(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let bits = u128::from(u32::from(v4));
            SPECIAL_V4
                .iter()
                .map(|&(first, len, name)| (u128::from(first), len, name))
                .find(|range| within(bits, 32, range))
                .map(|(_, _, name)| name)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return special_range(IpAddr::V4(v4));
            }
            SPECIAL_V6
                .iter()
                .find(|range| within(u128::from(v6), 128, range))
                .map(|(_, _, name)| *name)
        }
    }
}

/// Whether an address is on the public internet: in none of the special-purpose ranges
/// ([`special_range`]).
pub(crate) fn is_public(ip: std::net::IpAddr) -> bool {
    special_range(ip).is_none()
}

impl Origin {
    /// What keeps this origin's host off the public internet when that shows without a
    /// lookup: `localhost` (and names under it), or an IP address in a special-purpose
    /// range, said as a phrase for messages. `None` for a public address or another name.
    pub(crate) fn local_host(&self) -> Option<String> {
        let host = normal_host(&self.host);
        if host == "localhost" || host.ends_with(".localhost") {
            return Some("this machine".to_string());
        }
        let ip = ip_of(&host)?;
        special_range(ip).map(|range| format!("{ip} ({range})"))
    }

    /// `host:port`, as `--allow-host` takes it.
    pub(crate) fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Where a script's request may connect: `Ok(Some(address))` pins a plain `http://`
/// request to the address checked, `Ok(None)` lets the connection resolve the name (for
/// `https://`, whose certificate names the host). A host that is, or resolves to, an
/// address off the public internet needs the operator's approval.
pub(super) async fn check_address(
    target: &Origin,
    approvals: &crate::llm::KeyApprovals,
) -> Result<Option<std::net::SocketAddr>, String> {
    let host = normal_host(&target.host);
    let approved = approvals.is_host_approved(target);
    let addresses: Vec<std::net::SocketAddr> = match ip_of(&host) {
        Some(ip) => vec![std::net::SocketAddr::new(ip, target.port)],
        None => tokio::net::lookup_host((host.as_str(), target.port))
            .await
            .map_err(|e| format!("{target}: cannot resolve {host}: {e}"))?
            .collect(),
    };
    let Some(first) = addresses.first().copied() else {
        return Err(format!("{target}: {host} resolves to no address"));
    };
    if !approved && (host == "localhost" || host.ends_with(".localhost")) {
        return Err(format!(
            "refused {target}: {host} is this machine; the operator approves it with \
             --allow-host {host}"
        ));
    }
    if let Some(private) = addresses.iter().find(|a| !is_public(a.ip()))
        && !approved
    {
        return Err(format!(
            "refused {target}: {host} is (or resolves to) {}, a loopback or private \
             address; the operator approves it with --allow-host {host}",
            private.ip()
        ));
    }
    Ok((!target.https).then_some(first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn localhost_with_a_final_dot_or_in_capitals_is_loopback() {
        for host in ["localhost", "localhost.", "LOCALHOST", "LocalHost."] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["localhost.example.com", "mylocalhost", "127.0.0.1.nip.io"] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn ipv4_loopback_in_the_forms_inet_aton_reads_is_loopback() {
        for host in [
            "127.0.0.1",
            "127.1",
            "127.0.1",
            "127.255.255.254",
            "2130706433",
            "0x7f.1",
            "0X7F.0.0.1",
            "0177.0.0.1",
            "0x7f000001",
            "127.0.0.1.",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "128.0.0.1",
            "10.1",
            "0x80.1",
            "127.256.0.0.1",
            "127.0.0.0.1",
            "127.16777216",
            "0x",
            "08.0.0.1",
            "127.-1",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
        assert_eq!(ip_of("127.1"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ip_of("0x7f.1"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ip_of("0177.0.0.1"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ip_of("2130706433"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ip_of("10.1.0x10"), Some("10.1.0.16".parse().unwrap()));
        assert_eq!(ip_of("api.example.com"), None);
    }

    #[test]
    fn ipv6_loopback_and_ipv4_loopback_mapped_into_ipv6_are_loopback() {
        for host in [
            "::1",
            "[::1]",
            "[0:0:0:0:0:0:0:1]",
            "[::ffff:127.0.0.1]",
            "::ffff:127.0.0.1",
            "[::ffff:7f00:1]",
            "[::FFFF:127.1.2.3]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        // Carried through NAT64 or the deprecated compatible form, 127.0.0.1 is not this
        // machine's: no system routes them to its loopback.
        for host in [
            "[::2]",
            "[::ffff:10.0.0.1]",
            "[64:ff9b::127.0.0.1]",
            "[fe80::1]",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_base_url_of_an_inet_aton_form_is_judged_as_its_address() {
        let local = |url: &str| Origin::parse(url).unwrap().local_host();
        assert_eq!(
            local("http://127.1:9/v1").as_deref(),
            Some("127.0.0.1 (loopback, RFC 1122)")
        );
        assert_eq!(
            local("https://0x0a.1/v1").as_deref(),
            Some("10.0.0.1 (private use, RFC 1918)")
        );
        assert!(
            Origin::parse("http://[::ffff:127.0.0.1]:9")
                .unwrap()
                .is_loopback()
        );
        assert!(Origin::parse("http://localhost.:9").unwrap().is_loopback());
        assert!(Origin::parse("http://127.1:9").unwrap().is_loopback());
    }

    /// Each range of the registries: its first address, an address inside, its last
    /// address, and the range it must be judged in. Written out by hand from the IANA
    /// registries, not computed from the table.
    const RANGES: &[(&str, &str, &str, &str)] = &[
        (
            "0.0.0.0",
            "0.12.34.56",
            "0.255.255.255",
            "\"this network\", RFC 791",
        ),
        (
            "10.0.0.0",
            "10.1.2.3",
            "10.255.255.255",
            "private use, RFC 1918",
        ),
        (
            "100.64.0.0",
            "100.100.1.1",
            "100.127.255.255",
            "shared address space, RFC 6598",
        ),
        (
            "127.0.0.0",
            "127.0.0.1",
            "127.255.255.255",
            "loopback, RFC 1122",
        ),
        (
            "169.254.0.0",
            "169.254.169.254",
            "169.254.255.255",
            "link local, RFC 3927",
        ),
        (
            "172.16.0.0",
            "172.20.1.1",
            "172.31.255.255",
            "private use, RFC 1918",
        ),
        (
            "192.0.0.0",
            "192.0.0.8",
            "192.0.0.255",
            "IETF protocol assignments, RFC 6890",
        ),
        (
            "192.0.2.0",
            "192.0.2.55",
            "192.0.2.255",
            "documentation, TEST-NET-1, RFC 5737",
        ),
        (
            "192.88.99.0",
            "192.88.99.1",
            "192.88.99.255",
            "6to4 relay anycast, RFC 7526",
        ),
        (
            "192.168.0.0",
            "192.168.1.1",
            "192.168.255.255",
            "private use, RFC 1918",
        ),
        (
            "198.18.0.0",
            "198.19.1.1",
            "198.19.255.255",
            "benchmarking, RFC 2544",
        ),
        (
            "198.51.100.0",
            "198.51.100.7",
            "198.51.100.255",
            "documentation, TEST-NET-2, RFC 5737",
        ),
        (
            "203.0.113.0",
            "203.0.113.9",
            "203.0.113.255",
            "documentation, TEST-NET-3, RFC 5737",
        ),
        (
            "224.0.0.0",
            "239.1.2.3",
            "239.255.255.255",
            "multicast, RFC 5771",
        ),
        (
            "255.255.255.255",
            "255.255.255.255",
            "255.255.255.255",
            "limited broadcast, RFC 919",
        ),
        (
            "240.0.0.0",
            "250.1.2.3",
            "255.255.255.254",
            "reserved, RFC 1112",
        ),
        ("::", "::", "::", "unspecified, RFC 4291"),
        ("::1", "::1", "::1", "loopback, RFC 4291"),
        (
            "64:ff9b:1::",
            "64:ff9b:1:2::3",
            "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            "local-use IPv4/IPv6 translation, RFC 8215",
        ),
        (
            "100::",
            "100::1",
            "100::ffff:ffff:ffff:ffff",
            "discard only, RFC 6666",
        ),
        (
            "100:0:0:1::",
            "100:0:0:1::1",
            "100:0:0:1:ffff:ffff:ffff:ffff",
            "dummy prefix, RFC 9780",
        ),
        (
            "2001::",
            "2001:0:4136:e378::1",
            "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
            "IETF protocol assignments, RFC 2928",
        ),
        (
            "2001:db8::",
            "2001:db8:1::1",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            "documentation, RFC 3849",
        ),
        (
            "2002::",
            "2002:7f00:1::1",
            "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "6to4, RFC 3056",
        ),
        (
            "3fff::",
            "3fff:1::1",
            "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff",
            "documentation, RFC 9637",
        ),
        (
            "5f00::",
            "5f00:1::1",
            "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "segment routing SIDs, RFC 9602",
        ),
        (
            "fc00::",
            "fd12:3456::1",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "unique local, RFC 4193",
        ),
        (
            "fe80::",
            "fe80::1",
            "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "link local, RFC 4291",
        ),
        (
            "fec0::",
            "fec0::1",
            "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "site local, deprecated, RFC 3879",
        ),
        (
            "ff00::",
            "ff02::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "multicast, RFC 4291",
        ),
    ];

    fn range_of(ip: &str) -> Option<&'static str> {
        special_range(ip.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn every_special_purpose_range_is_off_the_public_internet_edge_to_edge() {
        for (first, inside, last, name) in RANGES {
            for ip in [first, inside, last] {
                assert_eq!(range_of(ip), Some(*name), "{ip}");
            }
        }
        // One case per entry of the table, so a range added there is added here too.
        assert_eq!(RANGES.len(), SPECIAL_V4.len() + SPECIAL_V6.len());
    }

    #[test]
    fn the_addresses_beside_each_range_are_public() {
        for ip in [
            "1.0.0.0",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.0.3.0",
            "192.88.98.255",
            "192.88.100.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.99.255",
            "198.51.101.0",
            "203.0.112.255",
            "203.0.114.0",
            "223.255.255.255",
            "93.184.216.34",
            "2a00:1450::1",
            "64:ff9b:2::",
            "64:ff9b:0:1::",
            "100:0:0:2::",
            "2001:200::",
            "2001:db7:ffff::",
            "2001:db9::",
            "2003::",
            "3ffe:ffff::",
            "4000::",
            "5eff:ffff::",
            "5f01::",
            "fbff:ffff::",
            "fe00::",
            "2606:2800:220:1::1",
        ] {
            assert_eq!(range_of(ip), None, "{ip}");
        }
    }

    #[test]
    fn an_ipv6_address_carrying_an_ipv4_one_is_judged_by_it() {
        for (ip, name) in [
            // IPv4-mapped, ::ffff:0:0/96.
            ("::ffff:127.0.0.1", Some("loopback, RFC 1122")),
            ("::ffff:10.0.0.1", Some("private use, RFC 1918")),
            ("::ffff:198.18.0.1", Some("benchmarking, RFC 2544")),
            ("::ffff:240.0.0.1", Some("reserved, RFC 1112")),
            ("::ffff:0:0", Some("\"this network\", RFC 791")),
            ("::ffff:93.184.216.34", None),
            // IPv4-compatible, ::/96 (deprecated).
            ("::127.0.0.1", Some("loopback, RFC 1122")),
            ("::10.0.0.1", Some("private use, RFC 1918")),
            ("::93.184.216.34", None),
            // IPv4-translated, ::ffff:0:0:0/96.
            ("::ffff:0:127.0.0.1", Some("loopback, RFC 1122")),
            ("::ffff:0:93.184.216.34", None),
            // NAT64, 64:ff9b::/96.
            ("64:ff9b::7f00:1", Some("loopback, RFC 1122")),
            ("64:ff9b::192.168.0.1", Some("private use, RFC 1918")),
            ("64:ff9b::169.254.169.254", Some("link local, RFC 3927")),
            ("64:ff9b::93.184.216.34", None),
        ] {
            assert_eq!(range_of(ip), name, "{ip}");
        }
    }

    #[test]
    fn an_origin_on_this_machine_or_a_special_address_says_what_it_is() {
        let local = |url: &str| Origin::parse(url).unwrap().local_host();
        assert_eq!(
            local("http://localhost:8080").as_deref(),
            Some("this machine")
        );
        assert_eq!(
            local("http://LOCALHOST.:1").as_deref(),
            Some("this machine")
        );
        assert_eq!(
            local("http://a.b.localhost").as_deref(),
            Some("this machine")
        );
        assert_eq!(
            local("http://[::ffff:7f00:1]:9").as_deref(),
            Some("::ffff:127.0.0.1 (loopback, RFC 1122)")
        );
        assert_eq!(
            local("https://198.18.0.7").as_deref(),
            Some("198.18.0.7 (benchmarking, RFC 2544)")
        );
        assert_eq!(local("https://93.184.216.34"), None);
        assert_eq!(local("https://localhost.example.com"), None);
        assert_eq!(
            Origin::parse("http://[::1]:8080").unwrap().host_port(),
            "[::1]:8080"
        );
    }
}
