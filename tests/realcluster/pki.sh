# Certificates of the real cluster, made with openssl under $RC_PKI: one CA for every component (a test
# cluster; a real one keeps separate CAs for etcd and the kubelets) and a front-proxy CA for the aggregator.
# Sourced by up.sh after env.sh.

_key() { [ -f "$RC_PKI/$1.key" ] || openssl genrsa -out "$RC_PKI/$1.key" 2048 2>/dev/null; }

# _cert NAME SUBJECT SANS [CA]: a key and a certificate signed by CA (default: ca), SANS as openssl's
# subjectAltName value ("" for a client certificate).
_cert() {
	local name=$1 subject=$2 sans=$3 ca=${4:-ca} ext
	[ -f "$RC_PKI/$name.crt" ] && return 0
	_key "$name"
	ext=$(mktemp)
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		if [ -n "$sans" ]; then
			echo "extendedKeyUsage=serverAuth,clientAuth"
			echo "subjectAltName=$sans"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"$ext"
	openssl req -new -key "$RC_PKI/$name.key" -subj "$subject" -out "$RC_PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$RC_PKI/$name.csr" -CA "$RC_PKI/$ca.crt" -CAkey "$RC_PKI/$ca.key" \
		-CAcreateserial -days 365 -extfile "$ext" -out "$RC_PKI/$name.crt" 2>/dev/null
	rm -f "$ext" "$RC_PKI/$name.csr"
}

_ca() {
	[ -f "$RC_PKI/$1.crt" ] && return 0
	_key "$1"
	openssl req -x509 -new -key "$RC_PKI/$1.key" -subj "/CN=$2" -days 365 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "$RC_PKI/$1.crt" 2>/dev/null
}

# _kubeconfig NAME CERT: a kubeconfig for a client certificate of this cluster.
_kubeconfig() {
	cat >"$RC_STATE/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: realcluster
  cluster:
    server: https://$RC_HOST_IP:$RC_APISERVER_PORT
    certificate-authority: $RC_PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $RC_PKI/$2.crt
    client-key: $RC_PKI/$2.key
contexts:
- name: realcluster
  context: {cluster: realcluster, user: $1}
current-context: realcluster
KC
}

make_pki() {
	mkdir -p "$RC_PKI"
	_ca ca realcluster-ca
	_ca front-proxy-ca realcluster-front-proxy-ca
	_cert apiserver "/CN=kube-apiserver" \
		"IP:$RC_HOST_IP,IP:127.0.0.1,IP:${RC_SERVICE_CIDR%.*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" ""
	_cert front-proxy-client "/CN=front-proxy-client" "" front-proxy-ca
	_cert admin "/O=system:masters/CN=realcluster-admin" ""
	_cert controller-manager "/CN=system:kube-controller-manager" ""
	_cert scheduler "/CN=system:kube-scheduler" ""
	_cert kubelet-client "/O=system:nodes/CN=system:node:$RC_NODE" ""
	_cert kubelet-serving "/CN=$RC_NODE" "IP:$RC_HOST_IP,IP:127.0.0.1,DNS:$RC_NODE"
	[ -z "$RC_NODE2" ] || _cert kubelet2-client "/O=system:nodes/CN=system:node:$RC_NODE2" ""
	[ -z "$RC_NODE2" ] || _cert kubelet2-serving "/CN=$RC_NODE2" "IP:$RC_HOST_IP,IP:127.0.0.1,DNS:$RC_NODE2"
	_key sa
	[ -f "$RC_PKI/sa.pub" ] || openssl rsa -in "$RC_PKI/sa.key" -pubout -out "$RC_PKI/sa.pub" 2>/dev/null
	_kubeconfig admin admin
	_kubeconfig controller-manager controller-manager
	_kubeconfig scheduler scheduler
	_kubeconfig kubelet kubelet-client
	[ -z "$RC_NODE2" ] || _kubeconfig kubelet2 kubelet2-client
}
