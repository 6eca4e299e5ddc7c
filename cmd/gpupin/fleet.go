package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/dynamic"

	"github.com/gpupin/gpupin/fleet"
)

func init() { register(fleetCommand) }

// kubeconfigFlag is the kubeconfig as kubectl finds it: this path, else
// $KUBECONFIG, else ~/.kube/config.
func kubeconfigFlag() cli.Flag {
	return &cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig `FILE` (default as kubectl: $KUBECONFIG, else ~/.kube/config)"}
}

func fleetCommand() *cli.Command {
	return &cli.Command{
		Name:      "fleet",
		Usage:     "show every node's engines, and proofs and failures by GPU model, driver and variant, from the Kubernetes API",
		UsageText: "gpupin fleet [--kubeconfig FILE] [--json]",
		Description: "Reads the GPUPinNode objects the nodes' agents write (docs/fleet.md) and prints the nodes × engines table " +
			"(state/variant, the failure reason, [the override]) and a matrix GPU model × driver × variant with the proved and " +
			"failed counts and the commonest failure reasons first. Nodes whose facts are simulated say so.",
		Flags: []cli.Flag{kubeconfigFlag(), &cli.BoolFlag{Name: "json", Usage: "print the nodes and the matrix as JSON"}},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("fleet takes no arguments")
			}
			cfg, err := fleet.ClientConfig(c.String("kubeconfig"), false)
			if err != nil {
				return err
			}
			dyn, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return err
			}
			nodes, err := fleet.ListNodes(c.Context, dyn)
			if err != nil {
				return err
			}
			rows := fleet.Matrix(nodes)
			if jsonOut(c) {
				return writeJSON(c.App.Writer, map[string]any{"nodes": nodes, "matrix": rows})
			}
			if len(nodes) == 0 {
				fmt.Fprintln(c.App.Writer, "no GPUPinNode objects: no agent runs with --node-name (docs/fleet.md)")
				return nil
			}
			fleet.WriteTable(c.App.Writer, nodes)
			fmt.Fprintln(c.App.Writer)
			fleet.WriteMatrix(c.App.Writer, rows)
			return nil
		},
	}
}
