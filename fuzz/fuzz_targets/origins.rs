//! Where a provider's `base_url` and a script's `allowed_hosts` entry point, as the host
//! reads them (`http::Uri`), against the WHATWG URL parser of the `url` crate (what reqwest
//! and browsers use): when both accept the text, they must name the same scheme, port and
//! host, so no text passes the host's checks as one host and reaches another. The input is
//! a base URL, a NUL byte, then an `allowed_hosts` entry.
//!
//! Left alone on purpose: text only one of them accepts; a host the host reads as a name
//! that `url` reads as an IPv4 address in another notation (`127.1`, `0x7f.0.0.1`): the host
//! resolves such a name and checks the address it resolves to; and a host `url` changes by
//! percent-decoding or IDNA mapping, which the host's name lookup would refuse.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use trellis_sandbox::llm::{HostRule, origin_parts};

/// A host the host would resolve or connect to as is: an IP literal, or a name of letters,
/// digits, `-` and `.` whose last label is not all digits.
fn plain(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = bare.trim_end_matches('.');
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && name.rsplit('.').next().is_some_and(|last| {
            !last
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'x' || b == b'X')
        })
        && !name
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b'x' || b == b'X')
}

/// The host as both compare it: lower case, no brackets, no final dot.
fn normal(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

fn same_host(ours: &str, theirs: &url::Url) -> bool {
    match theirs.host() {
        Some(url::Host::Ipv4(ip)) => normal(ours)
            .parse::<IpAddr>()
            .is_ok_and(|o| o == IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => normal(ours)
            .parse::<IpAddr>()
            .is_ok_and(|o| o == IpAddr::V6(ip)),
        Some(url::Host::Domain(d)) => normal(ours) == normal(d),
        None => false,
    }
}

fuzz_target!(|text: &str| {
    let (base_url, entry) = text.split_once('\0').unwrap_or((text, ""));
    if let (Ok((https, host, port)), Ok(theirs)) =
        (origin_parts(base_url), url::Url::parse(base_url))
    {
        let scheme = if https { "https" } else { "http" };
        if plain(&host) {
            assert_eq!(theirs.scheme(), scheme, "{base_url:?}: the scheme");
            assert_eq!(
                theirs.port_or_known_default(),
                Some(port),
                "{base_url:?}: the port"
            );
            assert!(
                same_host(&host, &theirs),
                "{base_url:?}: host {host:?}, url reads {:?}",
                theirs.host_str()
            );
        }
    }
    if let (Ok(rule), Ok(theirs)) = (
        HostRule::parse(entry),
        url::Url::parse(&format!("http://{}", entry.trim())),
    ) {
        let (host, port) = rule.parts();
        if plain(host) {
            assert!(
                same_host(host, &theirs),
                "{entry:?}: host {host:?}, url reads {:?}",
                theirs.host_str()
            );
            if let Some(port) = port {
                assert_eq!(
                    theirs.port_or_known_default(),
                    Some(port),
                    "{entry:?}: the port"
                );
            }
        }
    }
});
