//! The Table `kubectl get endpoints` shows.

use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use k8s_openapi::api::core::v1::Endpoints;
use serde_json::{Value, json};

const ENDPOINTS_DESCRIPTION: &str = "The set of all endpoints is the union of all subsets. Addresses are placed into subsets according to the IPs they share. A single address with multiple ports, some of which are ready and some of which are not (because they come from different containers) will result in the address being displayed in different subsets for the different ports. No address will appear in both Addresses and NotReadyAddresses in the same subset. Sets of addresses and ports that comprise a service.";

/// The columns.
pub fn columns() -> Vec<Column> {
    vec![
        NAME_COLUMN,
        Column {
            name: "Endpoints",
            kind: "string",
            format: "",
            description: ENDPOINTS_DESCRIPTION,
            priority: 0,
        },
        AGE_COLUMN,
    ]
}

/// The ENDPOINTS cell: ready `ip[:port]` entries, port-major, the first three then `+ N more...`.
fn endpoints_cell(endpoints: &Endpoints) -> String {
    let Some(subsets) = endpoints.subsets.as_ref().filter(|s| !s.is_empty()) else {
        return "<none>".into();
    };
    let mut entries = Vec::new();
    for subset in subsets {
        let ips: Vec<&str> = subset.addresses.iter().flatten().map(|a| &*a.ip).collect();
        let ports: Vec<i32> = subset.ports.iter().flatten().map(|p| p.port).collect();
        if ports.is_empty() {
            entries.extend(ips.iter().map(|ip| ip.to_string()));
        } else {
            for port in &ports {
                for ip in &ips {
                    entries.push(if ip.contains(':') {
                        format!("[{ip}]:{port}")
                    } else {
                        format!("{ip}:{port}")
                    });
                }
            }
        }
    }
    let shown = entries
        .iter()
        .take(3)
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    if entries.len() > 3 {
        format!("{shown} + {} more...", entries.len() - 3)
    } else {
        shown
    }
}

/// One row.
pub fn cells(endpoints: &Endpoints) -> Vec<Value> {
    vec![
        json!(endpoints.metadata.name.as_deref().unwrap_or_default()),
        json!(endpoints_cell(endpoints)),
        json!(age(&crate::created(&endpoints.metadata))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(object: Value) -> String {
        endpoints_cell(&serde_json::from_value(object).expect("endpoints"))
    }

    #[test]
    fn cells_follow_kubectl() {
        let two_ports = json!({"subsets": [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"port": 80}, {"port": 443}]}]});
        assert_eq!(
            cell(two_ports),
            "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 1 more..."
        );
        assert_eq!(cell(json!({})), "<none>");
        assert_eq!(
            cell(json!({"subsets": [{"notReadyAddresses": [{"ip": "10.0.0.1"}]}]})),
            ""
        );
        assert_eq!(
            cell(json!({"subsets": [{"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 80}]}]})),
            "[fd00::1]:80"
        );
    }
}
