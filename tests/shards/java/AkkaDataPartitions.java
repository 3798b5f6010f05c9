// Akka Persistence R2DBC's data-partition arithmetic, transcribed from
// core/src/main/scala/akka/persistence/r2dbc/R2dbcSettings.scala (akka/akka-persistence-r2dbc):
//   dataPartition(slice)                      = slice / (NumberOfSlices / numberOfDataPartitions)
//   resolveTableName(table, slice)            = table + "_" + dataPartition(slice)   (number-of-partitions > 1)
//   resolveConnectionFactoryConfigPath(b, s)  = b + "-" + (i * rangeSize) + "-" + (i * rangeSize + rangeSize - 1)
//       where rangeSize = numberOfDataPartitions / numberOfDatabases, i = dataPartition(slice) / rangeSize
// and the slice of Akka's Persistence.sliceForPersistenceId: Math.abs(pid.hashCode % 1024).
// Reads one persistence id per line; prints "pid slice table(P=8) factory(P=8,N=2) factory(P=8,N=4)".
// tests/shards/test_routing.py holds this program's output for its persistence ids as a fixed table.
import java.io.BufferedReader;
import java.io.InputStreamReader;

public class AkkaDataPartitions {
    static final int NumberOfSlices = 1024;

    static int dataPartition(int slice, int partitions) {
        return slice / (NumberOfSlices / partitions);
    }

    static String factory(int slice, int partitions, int databases) {
        int rangeSize = partitions / databases;
        int i = dataPartition(slice, partitions) / rangeSize;
        return "connection-factory-" + (i * rangeSize) + "-" + (i * rangeSize + rangeSize - 1);
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        String pid;
        while ((pid = in.readLine()) != null) {
            int slice = Math.abs(pid.hashCode() % NumberOfSlices);
            System.out.println(pid + " " + slice + " event_journal_" + dataPartition(slice, 8) + " "
                + factory(slice, 8, 2) + " " + factory(slice, 8, 4));
        }
    }
}
