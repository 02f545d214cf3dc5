# shellcheck shell=bash
# Certificates and kubeconfigs of the local cluster: one CA in DIR/pki (kept across starts), ECDSA P-256
# keys (cheap on 2 cores), a client certificate per component, each with its own user name so that RBAC
# grants each only its role (the operators get their upstream ClusterRoles, not cluster-admin).

# name  subject  (the O= is the group)
CLIENTS="admin:/O=system:masters/CN=e2e-admin
kube-controller-manager:/CN=system:kube-controller-manager
kube-scheduler:/CN=system:kube-scheduler
kubelet:/O=system:nodes/CN=system:node:localhost
kube-proxy:/CN=system:kube-proxy
apiserver-kubelet-client:/CN=kube-apiserver-kubelet-client
coredns:/CN=e2e:coredns
kuberay-operator:/CN=e2e:kuberay-operator
kueue:/CN=e2e:kueue
kwok:/CN=e2e:kwok"

_sign() {  # _sign NAME SUBJECT EXTENSIONS
  local d="$DIR/pki"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" \
    -keyout "$d/$1.key" -out "$d/$1.csr" 2>/dev/null || return 1
  printf '%b\n' "$3" > "$d/$1.ext"
  openssl x509 -req -in "$d/$1.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
    -extfile "$d/$1.ext" -out "$d/$1.crt" 2>/dev/null || return 1
  rm -f "$d/$1.csr" "$d/$1.ext"
}

pki() {
  local d="$DIR/pki" line
  if [ -f "$d/.complete" ]; then  # kept across starts: only a client added since (kwok) is signed now
    while IFS=: read -r name subj; do
      [ -f "$d/$name.crt" ] || { _sign "$name" "$subj" "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature" && chmod 600 "$d/$name".*; } || return 1
    done <<< "$CLIENTS"
    return 0
  fi
  rm -rf "$d"; mkdir -p "$d"; chmod 700 "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=gemma3-ray-e2e-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null || return 1
  _sign apiserver "/CN=kube-apiserver" "subjectAltName=IP:$GATEWAY,IP:$API_SERVICE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature" || return 1
  # Kueue's webhook server (registered by URL https://127.0.0.1:PORT) and its metrics server
  _sign kueue-webhook "/CN=kueue-webhook" "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature" || return 1
  while IFS=: read -r name subj; do
    _sign "$name" "$subj" "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature" || return 1
  done <<< "$CLIENTS"
  openssl ecparam -name prime256v1 -genkey -noout -out "$d/sa.key" 2>/dev/null || return 1
  openssl ec -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null || return 1
  chmod 600 "$d"/*
  touch "$d/.complete"
}

# kubeconfigs NAME...: DIR/pki/NAME.kubeconfig (the admin's is DIR/kubeconfig); the API port is new on
# every start, so they are rewritten every start
kubeconfigs() {
  local name f
  for name in "$@"; do
    f="$DIR/pki/$name.kubeconfig"; [ "$name" = admin ] && f="$DIR/kubeconfig"
    cat > "$f" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gemma3-ray-e2e
  cluster: {server: "https://$GATEWAY:$API_PORT", certificate-authority: "$DIR/pki/ca.crt"}
users:
- name: $name
  user: {client-certificate: "$DIR/pki/$name.crt", client-key: "$DIR/pki/$name.key"}
contexts:
- name: gemma3-ray-e2e
  context: {cluster: gemma3-ray-e2e, user: $name, namespace: default}
current-context: gemma3-ray-e2e
EOF
    chmod 600 "$f"
  done
}
