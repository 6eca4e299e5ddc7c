package fleet_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/node"
)

// Each GPUPinNode is owned by its Node (so Kubernetes' garbage collector
// removes it with the Node; no collector runs here, the reference is what
// is checked): a new object is made with the reference, an older agent's
// object gains it on the next write, a Node unknown at first gets it once
// it exists, and a Node made again replaces the stale UID. The status is
// written throughout. An agent may not name another Node, nor block an
// owner's deletion.
func TestGPUPinNodeOwnedByItsNode(t *testing.T) {
	needCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn, admin := clients(t, cluster.Admin())
	gpn := dyn.Resource(fleet.GPUPinNodes)
	for _, n := range []string{"own-new", "own-old", "own-late"} {
		gpn.Delete(ctx, n, metav1.DeleteOptions{})
		admin.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
	}
	nodeUID := func(name string) types.UID {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.UID
	}
	// owned waits for name's GPUPinNode to carry the agent's status and
	// exactly one owner reference, to the Node with uid ("": none).
	owned := func(name string, uid types.UID) *unstructured.Unstructured {
		t.Helper()
		var got *unstructured.Unstructured
		waitFor(t, 10*time.Second, name+"'s status owned by "+string(uid), func() bool {
			u, err := gpn.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			got = u
			driver, _, _ := unstructured.NestedString(u.Object, "status", "driver")
			refs := u.GetOwnerReferences()
			if uid == "" {
				return driver == "575.57.08" && len(refs) == 0
			}
			return driver == "575.57.08" && len(refs) == 1 && refs[0].UID == uid
		})
		r := got.GetOwnerReferences()
		if uid != "" && (r[0].APIVersion != "v1" || r[0].Kind != "Node" || r[0].Name != name || r[0].BlockOwnerDeletion != nil || r[0].Controller != nil) {
			t.Fatalf("owner reference %+v", r[0])
		}
		return got
	}
	start := func(name string) {
		t.Helper()
		n, err := fleet.NewNode(fleet.NodeOptions{Config: cluster.Config("gpupin:agent:" + name), NodeName: name,
			SyncTimeout: 3 * time.Second, StatusEvery: 200 * time.Millisecond,
			Facts: node.Static{Facts: &node.Facts{Driver: "575.57.08", CUDA: "12.9", Simulated: true}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(ctx, newFakeAgent()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Wait)
	}

	t.Run("made with it", func(t *testing.T) {
		mkNode(t, admin, "own-new", nil)
		start("own-new")
		owned("own-new", nodeUID("own-new"))
	})

	t.Run("an older agent's object gains it", func(t *testing.T) {
		mkNode(t, admin, "own-old", nil)
		old, err := gpn.Create(ctx, statusObj("own-old"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		start("own-old")
		if got := owned("own-old", nodeUID("own-old")); got.GetUID() != old.GetUID() {
			t.Fatalf("the object was made again (UID %s, was %s)", got.GetUID(), old.GetUID())
		}
	})

	t.Run("a Node unknown at first, then made, then made again", func(t *testing.T) {
		start("own-late")
		owned("own-late", "")
		mkNode(t, admin, "own-late", nil)
		first := nodeUID("own-late")
		owned("own-late", first)
		if err := admin.CoreV1().Nodes().Delete(ctx, "own-late", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		mkNode(t, admin, "own-late", nil)
		if again := nodeUID("own-late"); again == first {
			t.Fatal("the Node made again has the same UID")
		} else {
			owned("own-late", again)
		}
	})

	t.Run("the policy refuses another owner", func(t *testing.T) {
		agentDyn, _ := clients(t, cluster.Config("gpupin:agent:own-old"))
		uid := nodeUID("own-old")
		for _, tc := range []struct{ name, patch string }{
			{"another node", `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"own-new","uid":"` + string(nodeUID("own-new")) + `"}]}}`},
			{"blockOwnerDeletion", `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"own-old","uid":"` + string(uid) + `","blockOwnerDeletion":true}]}}`},
		} {
			_, err := agentDyn.Resource(fleet.GPUPinNodes).Patch(ctx, "own-old", types.MergePatchType, []byte(tc.patch), metav1.PatchOptions{})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "owned by its own Node only") {
				t.Errorf("%s: want Forbidden by the policy, got %v", tc.name, err)
			}
		}
		// Its own Node, as the agent writes it, is admitted.
		own := `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"own-old","uid":"` + string(uid) + `"}]}}`
		if _, err := agentDyn.Resource(fleet.GPUPinNodes).Patch(ctx, "own-old", types.MergePatchType, []byte(own), metav1.PatchOptions{}); err != nil {
			t.Errorf("its own Node: %v", err)
		}
	})
}
