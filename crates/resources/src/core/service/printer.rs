//! The Table `kubectl get services` shows.

use capstan_machinery::table::{AGE_COLUMN, Column, NAME_COLUMN, age};
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use serde_json::{Value, json};

use super::spec::kind;

const TYPE_DESCRIPTION: &str = "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types";
const CLUSTER_IP_DESCRIPTION: &str = "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies";
const EXTERNAL_IP_DESCRIPTION: &str = "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.";
const PORTS_DESCRIPTION: &str = "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies";
const SELECTOR_DESCRIPTION: &str = "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/";

/// The columns, in upstream's order.
pub fn columns() -> Vec<Column> {
    vec![
        NAME_COLUMN,
        Column::text("Type", TYPE_DESCRIPTION, 0),
        Column::text("Cluster-IP", CLUSTER_IP_DESCRIPTION, 0),
        Column::text("External-IP", EXTERNAL_IP_DESCRIPTION, 0),
        Column::text("Port(s)", PORTS_DESCRIPTION, 0),
        AGE_COLUMN,
        Column::text("Selector", SELECTOR_DESCRIPTION, 1),
    ]
}

/// The EXTERNAL-IP cell.
fn external(service: &Service, spec: &ServiceSpec) -> String {
    let external_ips = spec.external_ips.clone().unwrap_or_default();
    match kind(spec) {
        "ClusterIP" | "NodePort" if external_ips.is_empty() => "<none>".to_string(),
        "ClusterIP" | "NodePort" => external_ips.join(","),
        "LoadBalancer" => {
            let mut ingress: Vec<String> = service
                .status
                .iter()
                .filter_map(|s| s.load_balancer.as_ref())
                .flat_map(|l| l.ingress.iter().flatten())
                .filter_map(|i| {
                    let ip = i.ip.as_deref().unwrap_or_default();
                    let host = i.hostname.as_deref().unwrap_or_default();
                    let text = if ip.is_empty() { host } else { ip };
                    (!text.is_empty()).then(|| text.to_string())
                })
                .collect();
            ingress.sort();
            ingress.dedup();
            ingress.extend(external_ips);
            if ingress.is_empty() {
                "<pending>".to_string()
            } else {
                ingress.join(",")
            }
        }
        "ExternalName" => spec.external_name.clone().unwrap_or_default(),
        _ => "<unknown>".to_string(),
    }
}

/// One row.
pub fn cells(service: &Service) -> Vec<Value> {
    let spec = super::spec::of(service);
    let cluster_ip = spec
        .cluster_ips
        .as_ref()
        .and_then(|ips| ips.first())
        .or(spec.cluster_ip.as_ref())
        .filter(|ip| !ip.is_empty())
        .cloned()
        .unwrap_or_else(|| "<none>".into());
    let ports: Vec<String> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let protocol = p.protocol.as_deref().unwrap_or_default();
            match p.node_port.unwrap_or(0) {
                0 => format!("{}/{protocol}", p.port),
                node => format!("{}:{node}/{protocol}", p.port),
            }
        })
        .collect();
    let ports = if ports.is_empty() {
        "<none>".to_string()
    } else {
        ports.join(",")
    };
    let selector = spec
        .selector
        .as_ref()
        .filter(|m| !m.is_empty())
        .map(|m| {
            // Upstream (`labels.Set.String`) sorts the `key=value` texts, not the keys: the
            // orders differ when one key is a prefix of another (`a-b=1` before `a=2`).
            let mut pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
            pairs.sort();
            pairs.join(",")
        })
        .unwrap_or_else(|| "<none>".into());
    vec![
        json!(service.metadata.name.as_deref().unwrap_or_default()),
        json!(kind(&spec)),
        json!(cluster_ip),
        json!(external(service, &spec)),
        json!(ports),
        json!(age(&crate::created(&service.metadata))),
        json!(selector),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_port_row() {
        let svc = json!({"metadata":{"name":"s1"},"spec":{"type":"NodePort","clusterIPs":["10.96.0.10"],"selector":{"app":"np"},"ports":[{"port":80,"protocol":"TCP","nodePort":30080}]}});
        let row = cells(&serde_json::from_value(svc).expect("a Service"));
        assert_eq!(
            row[..5],
            [
                json!("s1"),
                json!("NodePort"),
                json!("10.96.0.10"),
                json!("<none>"),
                json!("80:30080/TCP")
            ]
        );
        assert_eq!(row[6], json!("app=np"));
    }

    #[test]
    fn external_name_row() {
        let svc = json!({"metadata":{"name":"x"},"spec":{"type":"ExternalName","externalName":"foo.bar.example.com"}});
        let row = cells(&serde_json::from_value(svc).expect("a Service"));
        assert_eq!(row[2], json!("<none>"));
        assert_eq!(row[3], json!("foo.bar.example.com"));
        assert_eq!(row[4], json!("<none>"));
        assert_eq!(row[6], json!("<none>"));
    }

    #[test]
    fn selector_pairs_sort_as_text_like_upstream() {
        let svc = json!({"metadata":{"name":"s"},"spec":{"type":"ClusterIP","selector":{"a":"2","a-b":"1","b":"0"}}});
        let row = cells(&serde_json::from_value(svc).expect("a Service"));
        assert_eq!(row[6], json!("a-b=1,a=2,b=0"));
    }
}
