# Sourced by the churn scripts. `serve_capstan DIR WAITS CMD...` runs CMD (`.../capstan serve`,
# possibly under a wrapper such as valgrind) with `--data-dir DIR/data` on a free loopback
# port, its output in DIR/log; sets PORT and CPID, and waits up to WAITS tenths of a second
# for the server to answer /readyz.
serve_capstan() {
    local dir=$1 waits=$2
    shift 2
    PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    "$@" --data-dir "$dir/data" --bind-address 127.0.0.1 --port "$PORT" > "$dir/log" 2>&1 &
    CPID=$!
    for _ in $(seq "$waits"); do
        [ -f "$dir/data/kubeconfig" ] && kubectl --kubeconfig "$dir/data/kubeconfig" get --raw /readyz > /dev/null 2>&1 && return 0
        sleep 0.1
    done
}
