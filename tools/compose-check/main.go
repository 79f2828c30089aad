// compose-check validates Compose files the way `docker compose config` does, for machines without Docker's
// compose plugin: it loads them with compose-go, the Compose specification's reference loader (JSON schema,
// interpolation, references between services, volumes and networks), and exits 1 naming what is wrong.
//
// Usage: compose-check FILE... (environment variables interpolate as with docker compose).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compose-check FILE...")
		os.Exit(2)
	}
	options, err := cli.NewProjectOptions(os.Args[1:], cli.WithOsEnv, cli.WithDotEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s: valid (project %q, %d services)\n", os.Args[1], project.Name, len(project.Services))
}
