//! Which hosts a script may reach: its step's `allowed_hosts` rules, and the address check
//! that keeps loopback and private addresses behind the operator's approval.

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

/// Whether an address is on the public internet: not loopback, private, link-local,
/// shared (CGNAT), unspecified, broadcast, multicast or an IPv6 unique-local address. An
/// IPv6 address that carries an IPv4 one (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
/// `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`) is judged as the IPv4 address: a network that
/// routes it reaches that address.
pub(crate) fn is_public(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            let nat64 = segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
            if nat64 {
                let [.., a, b, c, d] = v6.octets();
                return is_public(IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)));
            }
            // `to_ipv4` reads both `::ffff:a.b.c.d` and `::a.b.c.d` (`::1` as 0.0.0.1).
            if let Some(v4) = v6.to_ipv4() {
                return is_public(IpAddr::V4(v4));
            }
            let first = segments[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
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
    let addresses: Vec<std::net::SocketAddr> = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![std::net::SocketAddr::new(ip, target.port)],
        Err(_) => tokio::net::lookup_host((host.as_str(), target.port))
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
