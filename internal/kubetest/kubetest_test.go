package kubetest

import "testing"

// A kubelet takes three ports and etcd two; one port handed out twice made
// a kubelet exit at start ("bind: address already in use").
func TestFreePortsAreDistinct(t *testing.T) {
	for range 20 {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 3 || ports[0] == ports[1] || ports[0] == ports[2] || ports[1] == ports[2] || ports[0] == 0 {
			t.Fatalf("freePorts(3) = %v: want three distinct ports", ports)
		}
	}
}
